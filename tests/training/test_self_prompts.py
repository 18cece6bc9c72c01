"""training.self_prompts: the user turns a chat model writes itself are cut at the turn's end, and unclosed, short,
repeated or held-out ones are dropped."""
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoTokenizer

from training.self_prompts import end_of_turn_ids, keep, user_turn_prefix, write_user_turns

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = AutoTokenizer.from_pretrained("examples/reference/model")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = CHATML
    return tokenizer


class ScriptedModel:
    """generate() returns the prefix followed by fixed rows, padded with EOS: a model whose writing we choose."""

    def __init__(self, rows, eos):
        self.rows, self.device = rows, torch.device("cpu")
        self.generation_config = SimpleNamespace(eos_token_id=eos)
        self.calls = []

    def generate(self, input_ids, **options):
        self.calls.append(options)
        width = max(len(r) for r in self.rows)
        tail = torch.tensor([r + [options["pad_token_id"]] * (width - len(r)) for r in self.rows])
        return torch.cat([input_ids[: len(self.rows)], tail], dim=1)


def test_the_prefix_is_the_template_up_to_the_users_text(tokenizer):
    prefix = tokenizer.decode(user_turn_prefix(tokenizer))
    assert prefix == "<|im_start|>user\n"


def test_a_turn_ends_at_the_templates_end_of_turn_token_or_eos(tokenizer):
    assert end_of_turn_ids(tokenizer, ScriptedModel([], eos=0)) == sorted({0, tokenizer.convert_tokens_to_ids("<|im_end|>")})


def test_only_closed_new_turns_off_the_held_out_topics_are_kept(tokenizer):
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    rows = [
        ids("How do I repot a cactus without getting hurt?") + [end],
        ids("How do I repot a cactus without getting hurt?") + [end],  # a repeat
        ids("Give me a recipe for fluffy pancakes.") + [end],  # a held-out topic
        ids("Tell me a story about a dragon who never stopped talking and"),  # not closed
        ids("Hi") + [end],  # too short to be a request
        ids("Which rivers flow north in Europe?") + [end] + ids(" trailing text"),
    ]
    model = ScriptedModel(rows, eos=0)
    seen = set()
    turns = write_user_turns(model, tokenizer, count=len(rows), seed=0, seen=seen)
    assert turns == ["How do I repot a cactus without getting hurt?", "Which rivers flow north in Europe?"]
    assert model.calls[0]["do_sample"] and model.calls[0]["temperature"] == 1.0
    # a later batch never repeats what an earlier one kept
    assert write_user_turns(model, tokenizer, count=len(rows), seed=1, seen=seen) == []


def test_keep_counts_words_and_remembers():
    seen = set()
    assert keep("What rhymes with orange, really?", seen)
    assert not keep("what  rhymes with ORANGE, really?", seen)
    assert not keep("Three short words", seen)
