"""Greedy speculation returns exactly the model's own greedy output, token for token, for every drafter."""
import pytest
import torch

from selfspec import SelfSpecModel
from selfspec.drafters import MedusaDrafter, NgramDrafter
from tests.conftest import random_prompt, repetitive_prompt, tiny_model
from tests.selfspec.exercised import RecordingDrafter, assert_exercised, greedy_sequences, scrambled_model, trained_heads


def agreeing_heads(model, prompts, num_new=40, share_lm_head=True):
    """Heads briefly trained on the model's own greedy continuations of `prompts`: right often, wrong often.
    (Random heads on a tiny random model are never right, and their top probability is below the default
    min_draft_confidence, so they propose nothing: that once made these tests plain decoding.)"""
    return trained_heads(model, greedy_sequences(model, prompts, num_new), share_lm_head=share_lm_head)


def engine(model, drafter, prompts, **options):
    if drafter == "medusa":  # every head is consulted: the confidence stop has its own tests
        return SelfSpecModel(model, heads=agreeing_heads(model, prompts), min_draft_confidence=0.0, **options)
    return SelfSpecModel(model, drafter=drafter, **options)


def reference(model, prompt, max_new_tokens, eos_token_id):
    return model.generate(
        prompt, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos_token_id, pad_token_id=2,
        attention_mask=torch.ones_like(prompt),
    )


@pytest.mark.parametrize("drafter", ["ngram", "medusa", "none"])
@pytest.mark.parametrize("num_draft_tokens", [1, 3, 6])
def test_greedy_equals_model_generate(family, drafter, num_draft_tokens):
    model = tiny_model(family)
    prompts = (random_prompt(9, seed=1), repetitive_prompt(20, seed=2))
    spec = engine(model, drafter, prompts)
    stats = []
    for prompt in prompts:
        expected = reference(model, prompt, 40, eos_token_id=None)
        out = spec.generate(prompt, max_new_tokens=40, num_draft_tokens=num_draft_tokens, eos_token_id=[])
        assert torch.equal(out.sequences, expected)
        assert out.stats.new_tokens == 40
        assert out.stats.accepted + out.stats.target_forwards == 40  # every forward commits 1 + accepted tokens
        stats.append(out.stats)
        if drafter == "medusa":
            assert_exercised(out.stats, what=f"prompt {len(stats)}")
    if drafter == "none":
        assert sum(s.drafted for s in stats) == 0
    else:
        assert_exercised(stats)


def first_occurrences(tokens, at_or_after):
    """For each wanted position, the first position >= it whose token did not occur earlier (so an EOS there stops
    generation exactly there, not at an earlier copy)."""
    seen, firsts = set(), []
    for i, t in enumerate(tokens.tolist()):
        if t not in seen:
            firsts.append(i)
        seen.add(t)
    return sorted({next(i for i in firsts if i >= p) for p in at_or_after if any(i >= p for i in firsts)})


def ended_inside_a_step(stats) -> bool:
    """The stop token was an accepted draft (cut mid-step), not a step's recovered/bonus token: a run that ends on
    a step's own next token emitted target_forwards + accepted tokens; one cut inside accepted drafts, fewer."""
    return stats.new_tokens < stats.target_forwards + stats.accepted


@pytest.mark.parametrize("drafter", ["ngram", "medusa"])
def test_greedy_with_eos_stops_where_generate_stops(family, drafter):
    if drafter == "ngram":  # a tiny random model soon cycles through a few tokens, which n-gram drafts copy
        model, prompt = tiny_model(family, seed=3), random_prompt(9, seed=1)
    else:  # a scrambled one varies more (EOS can come late); the heads learn its continuation
        model = scrambled_model(family, seed=4)
        prompt = reference(model, random_prompt(9, seed=1), 12, eos_token_id=None)
    spec = engine(model, drafter, [prompt])
    free_run = reference(model, prompt, 30, eos_token_id=None)[0, prompt.shape[1]:]
    stats = []
    for position in first_occurrences(free_run, range(30)):  # make the token generated there the EOS token
        eos = int(free_run[position])
        expected = reference(model, prompt, 30, eos_token_id=eos)
        out = spec.generate(prompt, max_new_tokens=30, num_draft_tokens=4, eos_token_id=eos)
        assert torch.equal(out.sequences, expected)
        assert out.sequences[0, -1] == eos and out.stats.new_tokens == position + 1
        stats.append(out.stats)
    assert_exercised(stats)
    if drafter == "medusa":  # (n-gram drafts rarely hold a first occurrence; test_stopping's oracle cuts mid-step)
        assert any(ended_inside_a_step(s) for s in stats), "no EOS was an accepted draft: the mid-step cut was not taken"


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
    prompt = random_prompt(10, seed=8)
    heads = agreeing_heads(model, [prompt], num_new=30, share_lm_head=False)
    spec = SelfSpecModel(model, heads=heads, min_draft_confidence=0.0)
    out = spec.generate(prompt, max_new_tokens=30, eos_token_id=[], num_draft_tokens=heads.num_heads)  # every head drafts
    assert torch.equal(out.sequences, reference(model, prompt, 30, eos_token_id=None))
    assert_exercised(out.stats)


def test_plain_decoding_counts_one_token_per_forward():
    model = tiny_model("llama")
    out = SelfSpecModel(model, drafter="none").generate(random_prompt(5), max_new_tokens=12, eos_token_id=[])
    s = out.stats
    assert (s.new_tokens, s.target_forwards, s.tokens_per_forward, s.drafted) == (12, 12, 1.0, 0)


def test_medusa_drafts_from_the_hidden_state_of_the_last_accepted_position():
    """After a step accepts n drafts, the next drafts read hidden_all[n] of the verify forward: the final hidden state
    at the position that predicted the pending token, as a full forward over the sequence computes it.
    Greedy identity cannot see this (any drafts give exact output), so it is checked directly.
    Catches (planted): `hidden = hidden_all[-1]` and `hidden = hidden_all[0]` in the decode loop."""
    model = scrambled_model("llama", seed=4)
    prompt = random_prompt(9, seed=13)
    heads = agreeing_heads(model, [prompt], num_new=20)  # trained on the first 20 tokens only: wrong later
    drafter = RecordingDrafter(MedusaDrafter(heads, min_draft_confidence=0.0), keep_contexts=True)
    out = SelfSpecModel(model, drafter=drafter).generate(prompt, max_new_tokens=40, num_draft_tokens=4, eos_token_id=[])
    assert torch.equal(out.sequences, reference(model, prompt, 40, eos_token_id=None))
    assert_exercised(out.stats)
    with torch.no_grad():
        full = model.get_decoder()(input_ids=out.sequences).last_hidden_state[0]  # [T, hidden]
    for context in drafter.contexts:
        position = context.token_ids.shape[0] - 2  # predicted the pending token (the last of token_ids)
        torch.testing.assert_close(context.hidden_state, full[position], rtol=0, atol=1e-10)


def test_max_new_tokens_is_exact_when_a_step_accepts_up_to_it():
    """Every budget 0..11 is met exactly; no step drafts more than the budget leaves room for, and some generations
    end on a step whose accepted drafts reach the budget exactly (the engine caps k: no step accepts past it)."""
    model = tiny_model("llama")
    prompt = repetitive_prompt(30, seed=9)
    drafter = RecordingDrafter(NgramDrafter())
    spec = SelfSpecModel(model, drafter=drafter)
    ended_on_accepted = 0
    for max_new_tokens in range(0, 12):
        drafter.steps.clear(), drafter.outcomes.clear()
        out = spec.generate(prompt, max_new_tokens=max_new_tokens, num_draft_tokens=8, eos_token_id=[])
        assert out.sequences.shape[1] == prompt.shape[1] + max_new_tokens
        assert out.stats.new_tokens == max_new_tokens
        if max_new_tokens:
            assert torch.equal(out.sequences, reference(model, prompt, max_new_tokens, eos_token_id=None))
        emitted = 1  # the prefill's token
        for drafted, accepted in drafter.outcomes:  # every step, also those asked for no drafts
            assert drafted <= max_new_tokens - emitted - 1  # room for the drafts and the step's own next token
            emitted += accepted + 1
        ended_on_accepted += bool(drafter.outcomes) and drafter.outcomes[-1][1] > 0
    assert ended_on_accepted > 0, "no generation reached its budget inside a step's accepted drafts"


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
