"""Greedy speculation returns exactly the model's own greedy output, token for token, for every drafter."""
import pytest
import torch

from heads import MedusaHeads
from selfspec import SelfSpecModel
from tests.conftest import random_prompt, repetitive_prompt, tiny_model


def randomized_heads(model, seed=0, share_lm_head=True):
    """Heads with random (not identity) blocks, so drafts are sometimes right and often wrong."""
    heads = MedusaHeads.for_model(model, num_heads=4, share_lm_head=share_lm_head)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
    return heads


def reference(model, prompt, max_new_tokens, eos_token_id):
    return model.generate(
        prompt, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos_token_id, pad_token_id=2,
        attention_mask=torch.ones_like(prompt),
    )


@pytest.mark.parametrize("drafter", ["ngram", "medusa", "none"])
@pytest.mark.parametrize("num_draft_tokens", [1, 3, 6])
def test_greedy_equals_model_generate(family, drafter, num_draft_tokens):
    model = tiny_model(family)
    heads = randomized_heads(model) if drafter == "medusa" else None
    spec = SelfSpecModel(model, drafter=drafter, heads=heads)
    for prompt in (random_prompt(9, seed=1), repetitive_prompt(20, seed=2)):
        expected = reference(model, prompt, 40, eos_token_id=None)
        out = spec.generate(prompt, max_new_tokens=40, num_draft_tokens=num_draft_tokens, eos_token_id=[])
        assert torch.equal(out.sequences, expected)
        assert out.stats.new_tokens == 40
        assert out.stats.accepted + out.stats.target_forwards == 40  # every forward commits 1 + accepted tokens


@pytest.mark.parametrize("drafter", ["ngram", "medusa"])
def test_greedy_with_eos_stops_where_generate_stops(family, drafter):
    model = tiny_model(family, seed=3)
    heads = randomized_heads(model) if drafter == "medusa" else None
    spec = SelfSpecModel(model, drafter=drafter, heads=heads)
    prompt = repetitive_prompt(16, seed=4)
    free_run = reference(model, prompt, 30, eos_token_id=None)[0, prompt.shape[1]:]
    for position in (0, 5, 17):  # make the token generated at `position` the EOS token
        eos = int(free_run[position])
        expected = reference(model, prompt, 30, eos_token_id=eos)
        out = spec.generate(prompt, max_new_tokens=30, num_draft_tokens=4, eos_token_id=eos)
        assert torch.equal(out.sequences, expected)
        assert out.sequences[0, -1] == eos and out.stats.new_tokens == expected.shape[1] - prompt.shape[1]


def test_default_eos_comes_from_the_generation_config():
    model = tiny_model("llama", seed=5)
    prompt = random_prompt(8, seed=6)
    free_run = reference(model, prompt, 30, eos_token_id=None)[0, prompt.shape[1]:]
    model.generation_config.eos_token_id = int(free_run[7])
    expected = model.generate(prompt, max_new_tokens=30, do_sample=False, attention_mask=torch.ones_like(prompt))
    out = SelfSpecModel(model, drafter="ngram").generate(prompt, max_new_tokens=30)
    assert torch.equal(out.sequences, expected) and out.stats.new_tokens == 8


def test_medusa_with_own_lm_heads_is_exact_too():
    model = tiny_model("qwen2", seed=7)
    spec = SelfSpecModel(model, heads=randomized_heads(model, share_lm_head=False))
    prompt = random_prompt(10, seed=8)
    out = spec.generate(prompt, max_new_tokens=30, eos_token_id=[])
    assert torch.equal(out.sequences, reference(model, prompt, 30, eos_token_id=None))


def test_plain_decoding_counts_one_token_per_forward():
    model = tiny_model("llama")
    out = SelfSpecModel(model, drafter="none").generate(random_prompt(5), max_new_tokens=12, eos_token_id=[])
    s = out.stats
    assert (s.new_tokens, s.target_forwards, s.tokens_per_forward, s.drafted) == (12, 12, 1.0, 0)


def test_max_new_tokens_is_exact_when_a_step_accepts_past_it():
    model = tiny_model("llama")
    prompt = repetitive_prompt(30, seed=9)
    spec = SelfSpecModel(model, drafter="ngram")
    for max_new_tokens in range(0, 12):
        out = spec.generate(prompt, max_new_tokens=max_new_tokens, num_draft_tokens=8, eos_token_id=[])
        assert out.sequences.shape[1] == prompt.shape[1] + max_new_tokens
        assert out.stats.new_tokens == max_new_tokens
        if max_new_tokens:
            assert torch.equal(out.sequences, reference(model, prompt, max_new_tokens, eos_token_id=None))


def test_speculation_saves_forwards_when_drafts_are_right():
    """An oracle drafter (the model's own continuation) must cut forwards by ~k+1: the engine really speculates."""
    model = tiny_model("llama")
    prompt = random_prompt(6, seed=10)
    continuation = reference(model, prompt, 40, eos_token_id=None)[0]

    class Oracle:
        def propose(self, context):
            from selfspec import Draft

            n = context.token_ids.shape[0]
            return Draft(continuation[n : n + context.num_draft_tokens])

        def observe(self, num_drafted, num_accepted):
            pass

    out = SelfSpecModel(model, drafter=Oracle()).generate(prompt, max_new_tokens=40, num_draft_tokens=4, eos_token_id=[])
    assert torch.equal(out.sequences[0], continuation)
    assert out.stats.target_forwards == 1 + 8  # prefill, then 8 steps of 1 pending + 4 accepted (the last partial)
    assert out.stats.acceptance_by_position == [1.0, 1.0, 1.0, 1.0]
