"""Dtypes and devices: bfloat16/float16 models decode like `generate` in the same dtype where no near-tie can flip
an argmax; verification math stays float32; `from_pretrained` passes dtype and device_map through; heads follow
the model's dtype; stats report the heads' and the KV cache's bytes."""
from __future__ import annotations

import pytest
import torch

from heads import MedusaHeads
from heads.eagle import EagleHead
from selfspec import SelfSpecModel
from selfspec.cache_layer import SPARE_COLUMNS
from selfspec.sampling import logits_to_probs, SamplingConfig
from tests.conftest import tiny_model
from tests.selfspec.exercised import assert_exercised, greedy_sequences, scrambled_model, trained_heads
from tests.selfspec.tiny_text import save_model_dir, tiny_tokenizer

HALF_DTYPES = [torch.bfloat16, torch.float16]


def successor_model(dtype, cycle: int = 9, seed: int = 0):
    """A tiny Llama that confidently predicts next = f(current) for a permutation f made of `cycle`-long cycles:
    the LM head's row for f(x) is x's embedding, so the right logit beats the rest by a wide margin (no near-ties),
    and the continuation repeats, so n-gram drafts get accepted in bulk."""
    model = tiny_model(seed=seed, dtype=torch.float32)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(vocab, generator=g)
    successor = torch.empty(vocab, dtype=torch.long)
    for start in range(0, vocab, cycle):
        members = order[start : start + cycle]
        successor[members] = members.roll(-1)
    with torch.no_grad():
        embed = torch.randn(vocab, model.config.hidden_size, generator=g)
        model.get_input_embeddings().weight.copy_(embed)
        model.get_output_embeddings().weight[successor] = embed
    return model.to(dtype).eval()


def greedy_with_gaps(model, prompt, max_new_tokens):
    out = model.generate(
        prompt, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None,
        output_logits=True, return_dict_in_generate=True,
    )
    logits = torch.stack(out.logits)[:, 0].float()  # [new, vocab]
    top2 = logits.topk(2, dim=-1).values
    relative_gaps = (top2[:, 0] - top2[:, 1]) / logits.abs().amax(dim=-1)
    return out.sequences[0, prompt.shape[1] :].tolist(), relative_gaps


def prefix_before_near_tie(relative_gaps, dtype, units: int = 4) -> int:
    """Steps before the first whose top-2 logit gap is within `units` of `dtype`'s roundoff of the largest logit:
    there, batched verification and one-token decoding may round to different argmaxes, both correct."""
    near = (relative_gaps < units * torch.finfo(dtype).eps).nonzero()
    return int(near[0, 0]) if near.numel() else relative_gaps.shape[0]


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("drafter", ["ngram", "none"])
def test_half_precision_greedy_equals_generate_in_the_same_dtype(dtype, drafter):
    model = successor_model(dtype)
    engine = SelfSpecModel(model, drafter=drafter)
    prompt = torch.tensor([[5, 17, 33, 60, 71, 88]])
    expected, gaps = greedy_with_gaps(model, prompt, 40)
    n = prefix_before_near_tie(gaps, dtype, units=16)
    assert n == 40, f"the successor model should leave no near-ties (first at step {n})"
    out = engine.generate(prompt, max_new_tokens=40, eos_token_id=[], num_draft_tokens=3)  # "auto" follows the clock
    assert out.sequences[0, prompt.shape[1] :].tolist()[:n] == expected[:n]
    assert engine.target.lm_head.weight.dtype == dtype
    if drafter == "ngram":
        assert out.stats.accepted > 0  # verification of several tokens at once really happened in half precision


def test_random_bfloat16_model_equals_generate_until_the_first_near_tie():
    """A random model's logits are nearly flat (near-ties every few steps), so this checks a short prefix only."""
    model = tiny_model(seed=1, dtype=torch.bfloat16)
    prompt = torch.tensor([[7, 8, 9, 10, 7, 8, 9, 10, 7, 8]])
    expected, gaps = greedy_with_gaps(model, prompt, 30)
    n = prefix_before_near_tie(gaps, torch.bfloat16)
    got = SelfSpecModel(model, drafter="ngram").generate(prompt, max_new_tokens=30, eos_token_id=[]).sequences
    assert n >= 3 and got[0, prompt.shape[1] :].tolist()[:n] == expected[:n]


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_verification_math_is_float32_and_sampling_runs(dtype):
    logits = torch.randn(3, 50).to(dtype)
    assert logits_to_probs(logits, SamplingConfig(do_sample=True, top_p=0.9)).dtype == torch.float32
    assert logits_to_probs(logits, SamplingConfig()).dtype == torch.float32
    model = successor_model(dtype)
    heads = MedusaHeads.for_model(model, num_heads=2)
    assert next(heads.parameters()).dtype == dtype  # heads follow the model's dtype
    engine = SelfSpecModel(model, drafter="medusa", heads=heads)
    out = engine.generate(torch.tensor([[5, 17, 33]]), max_new_tokens=12, do_sample=True, temperature=0.7, seed=0,
                          eos_token_id=[])  # no EOS stop: the 12 tokens must not depend on the random stream
    assert out.stats.new_tokens == 12


def test_heads_module_built_in_float32_follows_a_half_precision_model():
    heads = MedusaHeads.for_model(tiny_model(dtype=torch.float32), num_heads=2)
    engine = SelfSpecModel(tiny_model(dtype=torch.bfloat16), drafter="medusa", heads=heads)
    assert all(p.dtype == torch.bfloat16 for p in engine.heads.parameters())
    assert engine.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=6).stats.new_tokens == 6


def test_from_pretrained_passes_dtype_and_device_map_and_heads_follow(tmp_path):
    model_dir = save_model_dir(tmp_path / "model", dtype=torch.float32)
    float_engine = SelfSpecModel.from_pretrained(model_dir, drafter="none")
    MedusaHeads.for_model(float_engine.model, num_heads=2).save_pretrained(tmp_path / "heads")

    engine = SelfSpecModel.from_pretrained(model_dir, heads=tmp_path / "heads", dtype=torch.bfloat16, device_map="auto")
    assert engine.model.dtype == torch.bfloat16 and engine.target.device.type == "cpu"
    assert all(p.dtype == torch.bfloat16 and p.device == engine.target.device for p in engine.heads.parameters())
    assert engine.tokenizer is not None
    plain = SelfSpecModel.from_pretrained(model_dir, heads=tmp_path / "heads", dtype=torch.bfloat16)
    prompt = "Café au lait"
    expected = plain.generate(prompt, max_new_tokens=8).sequences.tolist()
    assert engine.generate(prompt, max_new_tokens=8).sequences.tolist() == expected


def test_accelerate_dispatch_with_an_offloaded_layer(tmp_path):
    """A model split across devices runs through accelerate's hooks (here: one decoder layer offloaded to disk)."""
    model_dir = save_model_dir(tmp_path / "model", dtype=torch.float32)
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
                  "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    engine = SelfSpecModel.from_pretrained(model_dir, drafter="ngram", device_map=device_map,
                                           offload_folder=str(tmp_path / "offload"))
    assert engine.model.hf_device_map == device_map
    plain = SelfSpecModel.from_pretrained(model_dir, drafter="ngram")
    prompt = "Café au lait, crème brûlée. Café au"
    assert engine.generate(prompt, max_new_tokens=10).sequences.tolist() == plain.generate(prompt, max_new_tokens=10).sequences.tolist()


def test_stats_report_heads_and_peak_cache_bytes():
    model = scrambled_model("llama", seed=4).float()  # 2 layers, 2 KV heads of 8 dims
    prompt = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    heads = trained_heads(model, greedy_sequences(model, [prompt], 12), num_heads=3)  # right early, wrong later
    engine = SelfSpecModel(model, drafter="medusa", heads=heads, min_draft_confidence=0.0, draft_dtype=None)
    stats = engine.generate(prompt, max_new_tokens=20, eos_token_id=[], num_draft_tokens=3).stats
    assert_exercised(stats)  # drafts were written into the cache, and rejected ones rolled back
    assert stats.heads_bytes == sum(p.numel() * 4 for p in heads.parameters()) > 0
    per_token = 2 * 2 * 2 * 8 * 4  # layers * (keys, values) * KV heads * head dim * bytes
    # The cache ends up holding every committed token but the last (still pending), and at most a step's drafts and
    # the in-place layers' spare columns more (storage, as allocated).
    low, high = (8 + 20 - 1) * per_token, (8 + 20 - 1 + 3 + SPARE_COLUMNS) * per_token
    assert low <= stats.peak_cache_bytes <= high
    assert "KV cache peak" in stats.summary() and "heads" in stats.summary()
    assert SelfSpecModel(model, drafter="ngram").generate(prompt, max_new_tokens=4).stats.heads_bytes == 0


def test_tokenizer_vocab_fits_the_model():
    assert len(tiny_tokenizer()) <= tiny_model(vocab_size=300).config.vocab_size


def test_stats_count_the_lm_head_rows_a_draft_vocabulary_projects_onto():
    # a draft vocabulary's rows of the LM head are a copy (TargetModel.lm_head_rows): memory the drafter adds
    model = scrambled_model("llama", seed=4).float()
    prompt = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    vocab = torch.arange(0, 40, 2)
    row_bytes = vocab.numel() * model.config.hidden_size * 4
    shared = MedusaHeads.for_model(model, num_heads=2, draft_vocab=vocab)
    own = MedusaHeads.for_model(model, num_heads=2, share_lm_head=False, draft_vocab=vocab)
    eagle = EagleHead.for_model(model, draft_vocab=vocab)
    for heads, drafter, rows in ((shared, "medusa", row_bytes), (own, "medusa", 0), (eagle, "eagle", row_bytes)):
        engine = SelfSpecModel(model, drafter=drafter, heads=heads, draft_dtype=None)
        params = sum(p.numel() * 4 for p in heads.parameters())
        assert engine.generate(prompt, max_new_tokens=4).stats.drafter_parameter_bytes == params + rows
        batch = engine.generate([prompt[0], prompt[0, :5]], max_new_tokens=4, eos_token_id=[])
        assert batch.stats.drafter_parameter_bytes == params + rows
        assert all(row.drafter_parameter_bytes == params + rows for row in batch.row_stats)


@pytest.mark.usefixtures("needs_kernel")
def test_stats_count_the_bfloat16_copies_a_drafter_streams():
    # draft_dtype="auto" on a float32 model where the few-row kernel runs keeps a bfloat16 copy of every weight of the
    # drafter's linear layers (heads and draft-vocabulary rows): memory the drafter adds too
    model = scrambled_model("llama", seed=4).float()
    prompt = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    vocab = torch.arange(0, 40, 2)
    eagle = EagleHead.for_model(model, draft_vocab=vocab)
    engine = SelfSpecModel(model, heads=eagle)
    assert engine.draft_dtype is torch.bfloat16
    linear_weights = sum(m.weight.numel() for m in eagle.modules() if isinstance(m, torch.nn.Linear))
    rows = vocab.numel() * model.config.hidden_size
    expected = sum(p.numel() * 4 for p in eagle.parameters()) + rows * 4 + (linear_weights + rows) * 2
    assert engine.generate(prompt, max_new_tokens=4).stats.drafter_parameter_bytes == expected
    batch = engine.generate([prompt[0], prompt[0, :5]], max_new_tokens=4, eos_token_id=[])
    assert batch.stats.drafter_parameter_bytes == expected
    assert all(row.drafter_parameter_bytes == expected for row in batch.row_stats)
