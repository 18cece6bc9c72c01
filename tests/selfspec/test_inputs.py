"""What a prompt may be (selfspec/inputs.py): a tokenizer's padded batch with its attention mask decodes as the list
of its prompts without padding (left or right), each row exactly as that prompt alone; a one-row mask gives one
prompt; a mask that does not fit its ids is refused, saying why. (Chat prompts: test_chat.py; context-window and
other refusals: test_errors.py.)"""
import pytest
import torch

from selfspec import SelfSpecModel
from selfspec.inputs import unpadded_prompts
from tests.selfspec.tiny_text import tiny_text_model, tiny_tokenizer

TEXTS = ["The quick brown fox", "def main():\n    return 42\n stop here, then", "Café"]
OPTIONS = dict(max_new_tokens=12, eos_token_id=[], num_draft_tokens=2)


@pytest.fixture(scope="module")
def model():
    return tiny_text_model()


def wrapper(model, padding_side="right"):
    tokenizer = tiny_tokenizer()
    tokenizer.padding_side = padding_side
    return SelfSpecModel(model, drafter="ngram", tokenizer=tokenizer)


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_a_tokenizers_padded_batch_decodes_each_row_as_its_prompt_alone(model, padding_side):
    spec = wrapper(model, padding_side)
    batch = spec.tokenizer(TEXTS, padding=True, return_tensors="pt")  # input_ids and attention_mask, [3, T]
    assert (batch.attention_mask == 0).sum(dim=1).tolist().count(0) == 1  # two of the three rows are padded
    out = spec.generate(**batch, **OPTIONS)
    assert len(out.sequences) == len(TEXTS)
    for text, got in zip(TEXTS, out.sequences):
        assert torch.equal(got, spec.generate(text, **OPTIONS).sequences[0])  # the prompt alone, no padding
    assert out.stats.drafted > 0  # drafts were proposed (n-gram lookup in the prompts)
    stream = spec.stream(**batch, **OPTIONS)
    for _ in stream:
        pass
    assert stream.token_ids == [got[len(p):].tolist() for got, p in zip(out.sequences, stream.prompt_ids)]


def test_one_row_with_its_mask_is_one_prompt(model):
    spec = wrapper(model, "left")
    ids = spec.tokenizer(TEXTS[0], return_tensors="pt").input_ids  # [1, T]
    pad = torch.full((1, 3), spec.tokenizer.pad_token_id)
    padded, mask = torch.cat([pad, ids], dim=1), torch.cat([torch.zeros_like(pad), torch.ones_like(ids)], dim=1)
    expected = spec.generate(ids, **OPTIONS).sequences
    assert torch.equal(spec.generate(padded, attention_mask=mask, **OPTIONS).sequences, expected)  # [1, T] in
    assert torch.equal(spec.generate(padded[0], attention_mask=mask[0], **OPTIONS).sequences, expected)  # [T] in
    assert spec.stream(padded, attention_mask=mask, **OPTIONS).prompt_ids.tolist() == ids[0].tolist()


def test_unpadded_prompts_keeps_each_rows_tokens_in_order():
    ids = torch.tensor([[7, 8, 9, 0], [0, 0, 5, 6], [1, 2, 3, 4]])
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 1, 1], [1, 1, 1, 1]])
    assert [p.tolist() for p in unpadded_prompts(ids, mask)] == [[7, 8, 9], [5, 6], [1, 2, 3, 4]]
    assert unpadded_prompts(ids[1:2], mask[1:2].bool()).tolist() == [5, 6]  # one row: one [T] prompt


@pytest.mark.parametrize("input_ids, attention_mask, says", [
    (torch.ones(2, 5, dtype=torch.long), torch.ones(2, 4, dtype=torch.long), r"shape \(2, 4\) and input_ids \(2, 5\)"),
    (torch.ones(2, 3, dtype=torch.long), torch.tensor([[1, 1, 1], [0, 2, 1]]), "1 at tokens and 0 at padding"),
    (torch.ones(2, 3, dtype=torch.long), torch.tensor([[1, 1, 1], [1, 0, 1]]), "row 1 of attention_mask has padding "
     "between tokens"),
    (torch.ones(2, 3, dtype=torch.long), torch.tensor([[0, 0, 0], [1, 1, 1]]),
     "row 0 of attention_mask is all padding"),
    ("The quick brown fox", torch.ones(4, dtype=torch.long), "a text or chat prompt needs none"),
])
def test_a_mask_that_does_not_fit_its_ids_is_refused(model, input_ids, attention_mask, says):
    spec = wrapper(model)
    with pytest.raises(ValueError, match=says):
        spec.generate(input_ids, attention_mask=attention_mask, **OPTIONS)
    with pytest.raises(ValueError, match=says):
        spec.stream(input_ids, attention_mask=attention_mask, **OPTIONS)
