"""ModelParts runs a decoder layer by layer exactly as its own forward does, on every supported family, and fails
clearly for a decoder it cannot reach."""
import pytest
import torch
import transformers
from torch import nn
from transformers import DynamicCache

from selfspec import SelfSpecModel
from selfspec.model_parts import ModelParts
from tests.conftest import random_prompt, tiny_model

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "gpt2"]


@pytest.mark.parametrize("family", FAMILIES)
def test_layers_in_pieces_equal_the_decoder_forward(family):
    """Prefill, then decode in chunks whose layers run in two uneven pieces (layers briefly differ in length)."""
    model = tiny_model(family, num_layers=4)
    parts = ModelParts.of(model)
    ids = random_prompt(14, seed=1)
    expected = model.get_decoder()(input_ids=ids).last_hidden_state[0]  # [14, hidden], no cache at all
    cache = DynamicCache(config=model.config)
    pieces = [parts.norm(parts.run_layers(parts.embed(ids[:, :6], cache), cache, 0, 4))[0]]
    for (lo, hi), split in zip([(6, 7), (7, 10), (10, 14)], [1, 3, 2]):
        hidden = parts.run_layers(parts.embed(ids[:, lo:hi], cache), cache, 0, split)
        assert [cache.layers[i].get_seq_length() for i in range(4)] == [hi] * split + [lo] * (4 - split)
        pieces.append(parts.norm(parts.run_layers(hidden, cache, split, 4))[0])
    torch.testing.assert_close(torch.cat(pieces), expected, rtol=0, atol=1e-10)


def sliding_window_model(window):
    config = transformers.MistralConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=window,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).double().eval()


def test_a_sliding_window_model_works_past_its_window():
    """Layer by layer through a sliding-window cache, 14 tokens in chunks past a 4-token window, equals the decoder's
    own cache-free forward; and the window really matters here (without it the states differ)."""
    model = sliding_window_model(4)
    parts = ModelParts.of(model)  # its probe runs past the window
    ids = random_prompt(14, seed=1)
    expected = model.get_decoder()(input_ids=ids).last_hidden_state[0]  # [14, hidden]
    cache = DynamicCache(config=model.config)
    pieces = []
    for lo, hi in [(0, 6), (6, 7), (7, 10), (10, 14)]:
        hidden = parts.run_layers(parts.embed(ids[:, lo:hi], cache), cache, 0, 1)
        pieces.append(parts.norm(parts.run_layers(hidden, cache, 1, 3))[0])
    torch.testing.assert_close(torch.cat(pieces), expected, rtol=0, atol=1e-10)
    unwindowed = sliding_window_model(None).get_decoder()(input_ids=ids).last_hidden_state[0]
    assert (unwindowed[6:] - expected[6:]).abs().max() > 1e-3


def test_parts_do_not_touch_the_model_config():
    model = tiny_model("qwen3", num_layers=4)
    before = model.config.to_dict()
    spec = SelfSpecModel(model, drafter="early_exit", exit_layer=2)
    spec.generate(random_prompt(8), max_new_tokens=10, num_draft_tokens=3, eos_token_id=[])
    assert model.config.to_dict() == before


class _OpaqueDecoder(nn.Module):
    """A decoder whose forward works but whose layers are hidden (like a custom or compiled wrapper)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, **kwargs):
        return self.inner(**kwargs)


class _OpaqueCausalLM(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.wrapped, self.config = model, model.config
        self.decoder = _OpaqueDecoder(model.model)

    def get_decoder(self):
        return self.decoder

    def get_output_embeddings(self):
        return self.wrapped.lm_head

    def forward(self, input_ids, **kwargs):
        return self.wrapped(input_ids=input_ids, **kwargs)


def test_unreachable_layers_fail_clearly_naming_what_is_missing():
    model = _OpaqueCausalLM(tiny_model("llama"))
    SelfSpecModel(model, drafter="ngram")  # other drafters need no layers
    with pytest.raises(NotImplementedError, match=r"_OpaqueDecoder.*lacks embed_tokens, layers, norm, rotary_emb"):
        SelfSpecModel(model, drafter="early_exit", exit_layer=1)


def test_a_decoder_that_does_more_between_layers_fails_clearly():
    """Granite has the Llama layout but multiplies its embeddings: the wrap-time probe must catch it."""
    config = transformers.GraniteConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, embedding_multiplier=3.0,
    )
    model = transformers.AutoModelForCausalLM.from_config(config).double().eval()
    with pytest.raises(NotImplementedError, match="does not reproduce its own forward"):
        ModelParts.of(model)
