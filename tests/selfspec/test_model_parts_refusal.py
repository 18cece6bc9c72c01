"""Early exit on more decoder families, or a clear refusal when the wrapper is built: GPT-NeoX's layout (layers take
`layer_past`), a rotary embedding that takes the layer type (Gemma 3), a decoder that does more between its layers
(Granite's multipliers), and layers that need an argument early exit does not know. Never a TypeError at generate."""
import pytest
import torch
import transformers
from torch import nn

from selfspec import SelfSpecModel
from selfspec.model_parts import LAYOUTS, ModelParts
from tests.conftest import VOCAB, random_prompt, tiny_model

COMMON = dict(vocab_size=VOCAB, bos_token_id=0, eos_token_id=1, pad_token_id=2)
LAYERS = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4, max_position_embeddings=256)


def build(config):
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).to(torch.float64).eval()


def gpt_neox():
    return build(transformers.GPTNeoXConfig(**LAYERS, **COMMON))


def gemma3_text():
    # Alternating local (sliding, window 4) and global layers, each kind with its own rotary frequencies.
    config = transformers.Gemma3TextConfig(
        num_key_value_heads=2, head_dim=8, sliding_window=4, sliding_window_pattern=2, **LAYERS, **COMMON
    )
    return build(config)


@pytest.mark.parametrize("make", [gpt_neox, gemma3_text], ids=["gpt_neox", "gemma3_text"])
@pytest.mark.parametrize("do_sample", [False, True])
def test_early_exit_runs_these_families_exactly(make, do_sample):
    model = make()
    prompt = random_prompt(10, seed=1)
    spec = SelfSpecModel(model, drafter="early_exit", exit_layer=2)
    if do_sample:  # the same draws with speculation off and on would differ; check it runs and drafts
        out = spec.generate(prompt, max_new_tokens=16, do_sample=True, seed=0, num_draft_tokens=3, eos_token_id=[])
        assert out.stats.new_tokens == 16 and out.stats.drafted > 0
        return
    expected = model.generate(
        prompt, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=2, attention_mask=torch.ones_like(prompt)
    )
    out = spec.generate(prompt, max_new_tokens=20, num_draft_tokens=3, eos_token_id=[])
    assert torch.equal(out.sequences, expected)
    assert out.stats.drafted > 0 and out.stats.accepted > 0  # early exit really drafted, and was sometimes right


def test_rotary_by_layer_type_is_taken_per_layer():
    parts = ModelParts.of(gemma3_text())
    assert parts.layer_types == ["sliding_attention", "full_attention"] * 2
    assert ModelParts.of(gpt_neox()).layer_types is None


def test_a_decoder_doing_more_between_its_layers_is_refused_when_wrapped():
    config = transformers.GraniteConfig(
        num_key_value_heads=2, embedding_multiplier=2.0, residual_multiplier=0.5, **LAYERS, **COMMON
    )
    model = build(config)
    with pytest.raises(NotImplementedError, match="does not reproduce its own forward"):
        SelfSpecModel(model, drafter="early_exit", exit_layer=2)
    SelfSpecModel(model, drafter="ngram").generate(random_prompt(6), max_new_tokens=4)  # other drafters still work


class _NeedsRouterState(nn.Module):
    def forward(self, hidden_states, router_state, attention_mask=None, cache=None, **kwargs):
        return hidden_states


class _DropsTheCache(nn.Module):
    def forward(self, hidden_states, attention_mask=None, **kwargs):
        return hidden_states


@pytest.mark.parametrize("layer, message", [(_NeedsRouterState(), "router_state"), (_DropsTheCache(), "`cache`")])
def test_layers_wanting_other_arguments_are_refused_by_name(layer, message):
    model = tiny_model("llama")
    parts = ModelParts(model, model.get_decoder(), LAYOUTS[0])
    parts.layers = nn.ModuleList([layer])
    with pytest.raises(NotImplementedError, match=message):
        parts._check_signatures()
