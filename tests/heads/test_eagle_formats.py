"""EAGLE heads in other layouts (`heads/eagle_formats.py`): a published EAGLE-1/2 head computes the published math
(checked against the independent reference in `tests/heads/published_eagle.py`), heads of another base are refused
saying what differs, and a vLLM export carries the names and config keys vLLM reads and loads back exactly."""
import json

import pytest
import torch
import transformers
from safetensors.torch import load_file

from heads.eagle import EagleHead
from tests.conftest import random_prompt, tiny_model
from tests.heads import published_eagle as published


def post_norm_features(model, length=10, seed=0):
    """(features [T-1, H] the base's final post-norm states, embeddings [T-1, H] of the tokens they predict)."""
    tokens = random_prompt(length, seed=seed)[0]
    with torch.no_grad():
        hidden = model.get_decoder()(input_ids=tokens[None]).last_hidden_state[0]
        return hidden[:-1], model.get_input_embeddings()(tokens[1:])


def head_output(head, features, embeddings):
    with torch.no_grad():
        return head(features[None], embeddings[None], torch.arange(features.shape[0])[None])[0]


@pytest.mark.parametrize("file", ["pytorch_model.bin", "model.safetensors"])
@pytest.mark.parametrize("bias", [True, False])
def test_a_published_head_computes_the_published_math(tmp_path, file, bias):
    """Against a reference written from the published description: features and greedy tokens agree, in one pass and
    position by position through the head's cache.
    Planted bugs it caught: the concat in the 'selfspec' order (feature first), by the numbers; layer 0 keeping its
    input norm and an RMSNorm left at the output, both by the loader's strict names (the file has no such weights)."""
    model = tiny_model()
    # intermediate size 48: the layer follows the head's own config.json, not the base's (64)
    config = published.published_config(model, intermediate_size=48, bias=bias)
    weights = published.random_published_weights(model, config, bias=bias)
    published.write_published(tmp_path, weights, config, file)
    head = EagleHead.from_pretrained(tmp_path, model=model)
    assert head.config.layout == "eagle1" and head.config.fuse_bias == bias and head.fuse.weight.dtype == torch.float64
    features, embeddings = post_norm_features(model)
    expected = published.reference_eagle1(weights, config, features, embeddings)
    got = head_output(head, features, embeddings)
    # 1e-5: transformers computes the rotary angles in float32 even for a float64 model; planted bugs move them by 0.1
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    lm_head = model.get_output_embeddings()
    assert torch.equal(lm_head(got).argmax(-1), lm_head(expected).argmax(-1))
    # one position at a time through the head's cache, as the drafter runs it
    cache = head.new_cache()
    with torch.no_grad():
        steps = [head(features[None, i : i + 1], embeddings[None, i : i + 1], torch.tensor([[i]]), cache)[0]
                 for i in range(features.shape[0])]
    torch.testing.assert_close(torch.cat(steps), expected, rtol=1e-5, atol=1e-5)


def test_a_published_head_of_another_base_is_refused_saying_what_differs(tmp_path):
    """Planted bug it caught: no shape check before building (a size-mismatch error from load_state_dict instead)."""
    model = tiny_model()
    for name, other in [("wide", tiny_model(hidden=48)), ("vocab", tiny_model(vocab_size=128))]:
        config = published.published_config(other)
        published.write_published(tmp_path / name, published.random_published_weights(other, config), config)
    with pytest.raises(ValueError, match=r"another base \(hidden size 48, this model 32\).*--eagle-layout eagle1"):
        EagleHead.from_pretrained(tmp_path / "wide", model=model)
    with pytest.raises(ValueError, match=r"a vocabulary of 128 tokens, this model 96"):
        EagleHead.from_pretrained(tmp_path / "vocab", model=model)
    # same shapes, another training: the stored embedding gives it away
    config = published.published_config(model)
    published.write_published(tmp_path / "seed", published.random_published_weights(tiny_model(seed=3), config), config)
    with pytest.raises(ValueError, match="stores an embedding that differs"):
        EagleHead.from_pretrained(tmp_path / "seed", model=model)
    assert EagleHead.from_pretrained(tmp_path / "seed", model=model, check_base=False).config.layout == "eagle1"


def test_other_checkpoints_are_refused_clearly(tmp_path):
    model = tiny_model()
    config = published.published_config(model)
    weights = published.random_published_weights(model, config)
    # `midlayer.*` makes it SafeAILab's EAGLE-3 layout (read in test_eagle_speculators.py), whose fc this one's is not
    published.write_published(tmp_path / "eagle3", {**weights, "midlayer.hidden_norm.weight": torch.ones(32)}, config)
    with pytest.raises(ValueError, match=r"fc.weight has shape \(32, 64\), its config.json implies \(32, 32\)"):
        EagleHead.from_pretrained(tmp_path / "eagle3", model=model)
    incomplete = {k: v for k, v in weights.items() if "down_proj" not in k}
    published.write_published(tmp_path / "incomplete", incomplete, config)
    with pytest.raises(ValueError, match="no layers.0.mlp.down_proj.weight"):
        EagleHead.from_pretrained(tmp_path / "incomplete", model=model)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"format": "selfspec-medusa"}))
    with pytest.raises(ValueError, match="not an EAGLE head"):
        EagleHead.from_pretrained(tmp_path / "other", model=model)


def perturbed_head(model, **kwargs) -> EagleHead:
    head = EagleHead.for_model(model, **kwargs)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return head.eval()


def test_vllm_export_has_vllms_names_and_keys_and_loads_back_exactly(tmp_path):
    """Planted bugs it caught: exporting `fuse.weight` under our name instead of `fc.weight`; a missing `architectures`
    (vLLM's EAGLEConfig renames its entries to EagleLlamaForCausalLM)."""
    model = tiny_model()
    torch.manual_seed(0)
    head = perturbed_head(model, num_layers=2, layout="eagle1")
    head.save_pretrained(tmp_path / "plain", format="vllm")
    head.save_pretrained(tmp_path / "with-embedding", format="vllm", model=model)
    config = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (2, 32, 96)
    assert config["bias"] is False and config["rope_theta"] == model.config.rope_parameters["rope_theta"]
    assert isinstance(transformers.AutoConfig.from_pretrained(tmp_path / "plain"), transformers.LlamaConfig)
    layer = [f"{n}.weight" for n in published.LAYER_NAMES] + ["post_attention_layernorm.weight"]
    expected = {"fc.weight"} | {f"layers.{i}.{n}" for i in (0, 1) for n in layer} | {"layers.1.input_layernorm.weight"}
    assert set(load_file(tmp_path / "plain" / "model.safetensors")) == expected  # no layers.0.input_layernorm
    with_embedding = load_file(tmp_path / "with-embedding" / "model.safetensors")
    assert set(with_embedding) == expected | {"embed_tokens.weight"}
    assert torch.equal(with_embedding["embed_tokens.weight"], model.get_input_embeddings().weight)
    features, embeddings = post_norm_features(model)
    for directory in ("plain", "with-embedding"):
        loaded = EagleHead.from_pretrained(tmp_path / directory, model=model)
        assert loaded.config.base == head.config.base  # the signature travels in `selfspec_base`
        torch.testing.assert_close(head_output(loaded, features, embeddings), head_output(head, features, embeddings),
                                   rtol=0, atol=0)
    with pytest.raises(ValueError, match="different base model"):  # the carried signature still checks identity
        EagleHead.from_pretrained(tmp_path / "plain", model=tiny_model(seed=3))


def test_vllm_export_refuses_what_vllm_cannot_serve(tmp_path):
    model = tiny_model()
    with pytest.raises(ValueError, match="'selfspec' layout: its input norms"):
        EagleHead.for_model(model).save_pretrained(tmp_path / "a", format="vllm")
    with pytest.raises(ValueError, match="drafts among 4 tokens"):
        EagleHead.for_model(model, draft_vocab=torch.tensor([3, 4, 5, 6]), layout="eagle1").save_pretrained(
            tmp_path / "b", format="vllm")
    with pytest.raises(ValueError, match="Llama layers"):
        EagleHead.for_model(tiny_model("qwen2"), layout="eagle1").save_pretrained(tmp_path / "c", format="vllm")
    config = published.published_config(model, bias=True)
    published.write_published(tmp_path / "biased", published.random_published_weights(model, config), config)
    with pytest.raises(ValueError, match="fusion has a bias"):
        EagleHead.from_pretrained(tmp_path / "biased", model=model).save_pretrained(tmp_path / "d", format="vllm")
    assert not (tmp_path / "a").exists() and not (tmp_path / "d").exists()


def test_the_selfspec_format_keeps_both_layouts_and_old_configs_load_as_selfspec(tmp_path):
    """Planted bug it caught: from_pretrained dropping `layout` (an eagle1 head reloaded with norms and the other
    concat order)."""
    model = tiny_model()
    features, embeddings = post_norm_features(model)
    for layout in ("selfspec", "eagle1"):
        torch.manual_seed(0)
        head = perturbed_head(model, layout=layout)
        head.save_pretrained(tmp_path / layout)
        loaded = EagleHead.from_pretrained(tmp_path / layout, model=model)
        fields = ("base", "num_layers", "layout", "fuse_bias")  # base_config: JSON turns id2label's keys to strings
        assert [getattr(loaded.config, f) for f in fields] == [getattr(head.config, f) for f in fields]
        torch.testing.assert_close(head_output(loaded, features, embeddings), head_output(head, features, embeddings),
                                   rtol=0, atol=0)
    path = tmp_path / "selfspec" / "config.json"
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in raw.items() if k not in ("layout", "fuse_bias")}))  # as shipped before
    old = EagleHead.from_pretrained(tmp_path / "selfspec", model=model)
    assert old.config.layout == "selfspec" and "feature_norm.weight" in old.state_dict()


def test_a_fresh_eagle1_head_passes_the_feature_through():
    """W = [0, I] over cat(embedding, feature) and zeroed residual outputs: the untrained head is the identity."""
    model = tiny_model()
    head = EagleHead.for_model(model, layout="eagle1").eval()
    features, embeddings = post_norm_features(model)
    torch.testing.assert_close(head_output(head, features, embeddings), features)
    assert not any("norm" in name and not name.startswith("layers.") for name in head.state_dict())
    assert "layers.0.input_layernorm.weight" not in head.state_dict()
