"""Chat messages go through the tokenizer's chat template with the generation prompt, in generate and stream."""
from __future__ import annotations

import pytest

from selfspec import SelfSpecModel
from tests.conftest import tiny_model
from tests.selfspec.tiny_text import tiny_text_model, tiny_tokenizer

MESSAGES = [
    {"role": "system", "content": "You answer in French."},
    {"role": "user", "content": "Café au lait?"},
]


def test_messages_use_the_chat_template_and_match_generate_on_its_ids():
    tokenizer = tiny_tokenizer()
    model = tiny_text_model(seed=1)
    engine = SelfSpecModel(model, drafter="ngram", tokenizer=tokenizer)
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids = ids["input_ids"]
    assert tokenizer.decode(ids[0]).endswith("<|assistant|>")  # the generation prompt is there
    out = engine.generate(MESSAGES, max_new_tokens=12)
    assert out.sequences[0, : ids.shape[1]].tolist() == ids[0].tolist()
    expected = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert out.sequences.tolist() == expected.tolist()
    stream = engine.stream(MESSAGES, max_new_tokens=12)
    pieces = list(stream)
    assert stream.prompt_ids.tolist() == ids[0].tolist()
    assert [t for p in pieces for t in p.token_ids] == expected[0, ids.shape[1] :].tolist()
    assert "".join(p.text for p in pieces) == out.text


def test_a_tokenizer_without_a_chat_template_is_a_clear_error():
    engine = SelfSpecModel(tiny_text_model(), drafter="ngram", tokenizer=tiny_tokenizer(chat_template=False))
    with pytest.raises(ValueError, match="no chat template"):
        engine.generate(MESSAGES, max_new_tokens=4)
    with pytest.raises(ValueError, match="no chat template"):
        engine.stream(MESSAGES, max_new_tokens=4)


def test_messages_without_a_tokenizer_are_a_clear_error():
    engine = SelfSpecModel(tiny_model(), drafter="ngram")
    with pytest.raises(ValueError, match="need a tokenizer"):
        engine.generate(MESSAGES, max_new_tokens=4)
