"""Stop conditions: EOS ids (one, several, from the generation config), stop strings with `generate`'s exact
semantics, and `max_new_tokens`; nothing after a stop is returned or streamed, even when a step accepted past it."""
from __future__ import annotations

import pytest
import torch

from selfspec import Draft, SelfSpecModel
from selfspec.stopping import StopCondition, StopStrings
from tests.conftest import repetitive_prompt, tiny_model
from tests.selfspec.tiny_text import tiny_text_model, tiny_tokenizer


class OracleDrafter:
    """Drafts the true greedy continuation, so every step accepts all its draft tokens: stops land mid-step."""

    def __init__(self, sequence: torch.Tensor):
        self.sequence = sequence  # [prompt + continuation]

    def propose(self, context) -> Draft:
        start = context.token_ids.shape[0]
        return Draft(self.sequence[start : start + context.num_draft_tokens].clone())

    def observe(self, num_drafted, num_accepted):
        pass


def greedy_reference(model, prompt, max_new_tokens, **kwargs) -> list[int]:
    out = model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False, **kwargs)
    return out[0, prompt.shape[1] :].tolist()


def run_both(engine: SelfSpecModel, prompt, **kwargs):
    """(generate's new tokens, streamed tokens, the stream's step sizes). Callers fix num_draft_tokens: under "auto"
    whether drafts are asked for at all follows the wall clock, and the tests assert that steps accepted several."""
    out = engine.generate(prompt, **kwargs)
    stream = engine.stream(prompt, **kwargs)
    steps = [piece.token_ids for piece in stream]
    streamed = [t for step in steps for t in step]
    return out.sequences[0, prompt.shape[1] :].tolist(), streamed, [len(s) for s in steps]


# -- StopCondition alone: table-driven -----------------------------------------------------------------------

@pytest.mark.parametrize(
    "max_new, eos, steps, expected, done_after",
    [
        (5, [], [[7], [8, 9, 10, 11, 12]], [[7], [8, 9, 10, 11]], 2),  # a step accepted past the budget
        (9, [1], [[7], [8, 1, 9]], [[7], [8, 1]], 2),  # EOS mid-step: cut right after it
        (9, [1, 3], [[7], [8, 3, 1, 9]], [[7], [8, 3]], 2),  # several EOS ids: the first one wins
        (9, [1], [[1]], [[1]], 1),  # EOS as the very first token
        (3, [1], [[7, 8, 9, 1]], [[7, 8, 9]], 1),  # the budget runs out before the EOS
        (0, [1], [], [], 0),
    ],
)
def test_stop_condition_table(max_new, eos, steps, expected, done_after):
    stop = StopCondition(max_new, eos)
    admitted = []
    for i, step in enumerate(steps):
        assert not stop.done, f"done before step {i}"
        admitted.append(stop.admit(step))
    assert admitted == expected
    assert stop.done and stop.num_emitted == sum(map(len, expected))
    assert len(steps) == done_after


# -- EOS through the engine ----------------------------------------------------------------------------------

def test_single_and_several_eos_match_generate_even_mid_step():
    model, prompt = tiny_model(), repetitive_prompt()
    free = greedy_reference(model, prompt, 30, eos_token_id=None)
    oracle = OracleDrafter(torch.cat([prompt[0], torch.tensor(free)]))
    engine = SelfSpecModel(model, drafter=oracle)
    first_at = {}
    for i, t in enumerate(free):
        first_at.setdefault(t, i)
    # EOS candidates whose first occurrence is not at the start, so the cut lands inside an accepted step.
    late = sorted((i, t) for t, i in first_at.items() if i >= 4)
    (i1, eos1), (i2, eos2) = late[0], late[1]
    for eos, cut in ((eos1, i1), ([eos2, eos1], min(i1, i2)), ([eos2], i2)):
        expected = greedy_reference(model, prompt, 30, eos_token_id=eos)
        assert expected == free[: cut + 1]
        returned, streamed, sizes = run_both(engine, prompt, max_new_tokens=30, eos_token_id=eos, num_draft_tokens=4)
        assert returned == streamed == expected
        assert max(sizes) > 1  # the oracle makes steps accept several tokens


def test_eos_from_generation_config():
    model, prompt = tiny_model(), repetitive_prompt()
    free = greedy_reference(model, prompt, 20, eos_token_id=None)
    model.generation_config.eos_token_id = [free[6], 1]
    engine = SelfSpecModel(model, drafter="ngram")
    expected = greedy_reference(model, prompt, 20)
    assert len(expected) < 20
    returned, streamed, _ = run_both(engine, prompt, max_new_tokens=20)
    assert returned == streamed == expected


# -- max_new_tokens ------------------------------------------------------------------------------------------

def test_max_new_tokens_exact_with_ngram_on_a_repetitive_prompt():
    model, prompt = tiny_model(), repetitive_prompt(40)
    engine = SelfSpecModel(model, drafter="ngram")
    free = greedy_reference(model, prompt, 24, eos_token_id=None)
    multi_token_steps = 0
    for n in (1, 2, 3, 7, 13, 24):
        returned, streamed, sizes = run_both(engine, prompt, max_new_tokens=n, eos_token_id=[], num_draft_tokens=3)
        assert returned == streamed == free[:n]
        multi_token_steps += sum(s > 1 for s in sizes)
    assert multi_token_steps > 0  # the drafter did accept in bulk on this prompt


# -- stop strings ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def text_setup():
    tokenizer = tiny_tokenizer()
    model = tiny_text_model(seed=2)
    prompt = tokenizer("Café au lait, crème brûlée. Café au", return_tensors="pt").input_ids
    free = greedy_reference(model, prompt, 40, eos_token_id=None)
    return model, tokenizer, prompt, free


def clean_strings(tokenizer, ids):
    """(index, decoded text) of tokens that decode to whole characters (no partial UTF-8 byte)."""
    return [(i, s) for i, s in ((i, tokenizer.decode([t])) for i, t in enumerate(ids)) if s and "\ufffd" not in s]


def stop_string_cases(tokenizer, prompt, free):
    """Stop strings that span two tokens, end inside a token, or are several."""
    clean = clean_strings(tokenizer, free)
    pairs = [(i, a + b) for (i, a), (j, b) in zip(clean, clean[1:]) if j == i + 1 and i >= 3]
    inside = [(i, s) for i, s in clean if len(s) >= 2 and i >= 3]
    assert pairs and inside, "the reference continuation has no usable text; pick another seed"
    return {
        "spans two tokens": [pairs[0][1]],
        "ends inside a token": [inside[0][1][:-1]],  # the completing token runs past the stop string
        "several strings": [pairs[-1][1], inside[0][1][:-1]],
    }


def test_stop_strings_match_generate(text_setup):
    model, tokenizer, prompt, free = text_setup
    oracle = OracleDrafter(torch.cat([prompt[0], torch.tensor(free)]))
    for engine in (SelfSpecModel(model, drafter="ngram", tokenizer=tokenizer),
                   SelfSpecModel(model, drafter=oracle, tokenizer=tokenizer)):
        for case, strings in stop_string_cases(tokenizer, prompt, free).items():
            expected = greedy_reference(model, prompt, 40, eos_token_id=None, stop_strings=strings, tokenizer=tokenizer)
            assert len(expected) < 40, case
            returned, streamed, _ = run_both(engine, prompt, max_new_tokens=40, eos_token_id=[], stop_strings=strings)
            assert returned == streamed == expected, case
            text = engine.generate(prompt, max_new_tokens=40, eos_token_id=[], stop_strings=strings).text
            assert any(s in tokenizer.decode(prompt[0].tolist() + returned) for s in strings), case
            assert text == tokenizer.decode(expected, skip_special_tokens=True)


def test_stop_strings_matcher_keeps_history_across_steps(text_setup):
    _, tokenizer, prompt, free = text_setup
    strings = stop_string_cases(tokenizer, prompt, free)["spans two tokens"]
    # Feeding the continuation one token at a time or all at once finds the same completing token.
    whole = StopStrings(strings, tokenizer, prompt[0].tolist()).first_match(free)
    one_by_one = StopStrings(strings, tokenizer, prompt[0].tolist())
    hits = [k for k, t in enumerate(free) if one_by_one.first_match([t]) == 0]
    assert whole is not None and hits[0] == whole


def test_stop_string_may_begin_in_the_prompt_but_must_end_in_a_new_token():
    tokenizer = tiny_tokenizer()
    prompt, new = tokenizer("Café au").input_ids, tokenizer(" lait, crème").input_ids
    assert StopStrings(["au l"], tokenizer, prompt).first_match(new) == 0
    assert StopStrings(["Café"], tokenizer, prompt).first_match(new) is None  # wholly in the prompt: no stop
    assert StopStrings(["ait,"], tokenizer, prompt).first_match(new) == new.index(tokenizer.convert_tokens_to_ids(","))


def test_stop_strings_need_a_tokenizer():
    engine = SelfSpecModel(tiny_model(), drafter="ngram")
    with pytest.raises(ValueError, match="tokenizer"):
        engine.generate(repetitive_prompt(), max_new_tokens=4, stop_strings=["x"])
    with pytest.raises(ValueError, match="stop_strings"):
        StopStrings([""], tiny_tokenizer())
