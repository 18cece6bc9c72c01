"""Published Medusa heads (read) and vLLM's Medusa layout (write, read back), on directories built here."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from heads import MedusaHeads
from tests.conftest import random_prompt, tiny_model

HIDDEN, VOCAB = 32, 96


def published_state(num_heads, num_layers, own_lm_head, seed=0, prefix=""):
    """A state dict as FasterDecoding/Medusa saves it: {i}.{j}.linear.* blocks, then {i}.{num_layers}.weight."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for i in range(num_heads):
        for j in range(num_layers):
            state[f"{prefix}{i}.{j}.linear.weight"] = torch.randn(HIDDEN, HIDDEN, generator=g, dtype=torch.float64) * 0.1
            state[f"{prefix}{i}.{j}.linear.bias"] = torch.randn(HIDDEN, generator=g, dtype=torch.float64) * 0.1
        if own_lm_head:
            state[f"{prefix}{i}.{num_layers}.weight"] = torch.randn(VOCAB, HIDDEN, generator=g, dtype=torch.float64)
    return state


def write_published(directory, state, config, extension):
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    if extension == "safetensors":
        save_file(state, str(directory / "medusa_lm_head.safetensors"))
    else:
        torch.save(state, directory / "medusa_lm_head.pt")
    return directory


def expected_logits(state, hidden, num_heads, num_layers, lm_head_weight=None):
    """Medusa's own definition, written out: x <- x + SiLU(W x + b) per block, then the head's (or base's) LM head."""
    out = []
    for i in range(num_heads):
        x = hidden
        for j in range(num_layers):
            x = x + torch.nn.functional.silu(x @ state[f"{i}.{j}.linear.weight"].T + state[f"{i}.{j}.linear.bias"])
        weight = lm_head_weight if lm_head_weight is not None else state[f"{i}.{num_layers}.weight"]
        out.append(x @ weight.T)
    return torch.stack(out, dim=-2)


def hidden_of(model):
    return model.model(input_ids=random_prompt()).last_hidden_state[0]  # [T, hidden]


@pytest.mark.parametrize("extension", ["safetensors", "pt"])
def test_published_v1_heads_with_their_own_lm_heads_load_exactly(tmp_path, extension):
    model = tiny_model()
    state = published_state(num_heads=3, num_layers=2, own_lm_head=True)
    # Uploaded configs under-report the heads (servers take the number from a flag): trust the tensors.
    config = {"medusa_num_heads": 2, "medusa_num_layers": 2, "base_model_name_or_path": "someone/tiny"}
    heads = MedusaHeads.from_pretrained(write_published(tmp_path / "h", state, config, extension), model=model)
    assert (heads.num_heads, heads.config.num_layers, heads.config.share_lm_head) == (3, 2, False)
    assert heads.config.base.name_or_path == "someone/tiny"
    assert torch.equal(heads.blocks[2][1].linear.bias, state["2.1.linear.bias"])
    assert torch.equal(heads.lm_heads[1].weight, state["1.2.weight"])
    hidden = hidden_of(model)
    torch.testing.assert_close(heads(hidden, model.lm_head), expected_logits(state, hidden, 3, 2))


@pytest.mark.parametrize("extension", ["safetensors", "pt"])
def test_published_v2_heads_reuse_the_base_lm_head(tmp_path, extension):
    model = tiny_model()
    state = published_state(num_heads=4, num_layers=1, own_lm_head=False, prefix="medusa_head.")
    config = {"medusa_num_heads": 4, "medusa_num_layers": 1, "version": "2", "base_model_name_or_path": "x"}
    heads = MedusaHeads.from_pretrained(write_published(tmp_path / "h", state, config, extension), model=model)
    assert (heads.num_heads, heads.config.share_lm_head, heads.config.base.vocab_size) == (4, True, VOCAB)
    hidden = hidden_of(model)
    plain = {k.removeprefix("medusa_head."): v for k, v in state.items()}
    torch.testing.assert_close(
        heads(hidden, model.lm_head), expected_logits(plain, hidden, 4, 1, model.lm_head.weight)
    )


def test_published_shared_heads_without_a_model_need_a_vocab_size(tmp_path):
    state = published_state(num_heads=2, num_layers=1, own_lm_head=False)
    directory = write_published(tmp_path / "h", state, {"medusa_num_layers": 1, "version": "2"}, "safetensors")
    with pytest.raises(ValueError, match="pass the base|model=model"):
        MedusaHeads.from_pretrained(directory)
    (directory / "config.json").write_text(json.dumps({"medusa_num_layers": 1, "vocab_size": VOCAB}))
    assert MedusaHeads.from_pretrained(directory).config.base.vocab_size == VOCAB


def test_published_heads_of_another_hidden_size_fail_clearly(tmp_path):
    state = published_state(num_heads=2, num_layers=1, own_lm_head=True)
    directory = write_published(tmp_path / "h", state, {"medusa_num_layers": 1}, "safetensors")
    with pytest.raises(ValueError, match="hidden size 32 but the model has 48"):
        MedusaHeads.from_pretrained(directory, model=tiny_model(hidden=48))


def test_published_heads_with_a_missing_tensor_fail_clearly(tmp_path):
    state = published_state(num_heads=2, num_layers=1, own_lm_head=True)
    del state["1.0.linear.bias"]
    directory = write_published(tmp_path / "h", state, {"medusa_num_layers": 1}, "safetensors")
    with pytest.raises(ValueError, match="no tensor '1.0.linear.bias'"):
        MedusaHeads.from_pretrained(directory)


def trained_like(heads, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return heads


def test_vllm_export_with_a_shared_lm_head_has_exactly_vllms_names_and_shapes(tmp_path):
    model = tiny_model()
    heads = trained_like(MedusaHeads.for_model(model, num_heads=3, num_layers=2))
    with pytest.raises(ValueError, match="pass the base model"):
        heads.save_pretrained(tmp_path / "no-model", format="vllm")
    heads.save_pretrained(tmp_path / "vllm", format="vllm", model=model)
    config = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert {k: config[k] for k in (
        "model_type", "architectures", "hidden_size", "vocab_size", "num_heads", "num_hidden_layers",
        "truncated_vocab_size", "medusa_fc_bias", "original_lm_head",
    )} == dict(
        model_type="medusa", architectures=["MedusaModel"], hidden_size=HIDDEN, vocab_size=VOCAB, num_heads=3,
        num_hidden_layers=2, truncated_vocab_size=VOCAB, medusa_fc_bias=True, original_lm_head=True,
    )
    weights = load_file(str(tmp_path / "vllm" / "model.safetensors"))
    expected = {f"blocks.{i}.layers.{j}.{p}": (HIDDEN, HIDDEN) if p == "weight" else (HIDDEN,)
                for i in range(3) for j in range(2) for p in ("weight", "bias")}
    expected["lm_heads.0.weight"] = (VOCAB, HIDDEN)
    assert {k: tuple(v.shape) for k, v in weights.items()} == expected
    assert torch.equal(weights["lm_heads.0.weight"], model.lm_head.weight)
    assert torch.equal(weights["blocks.2.layers.1.bias"], heads.blocks[2][1].linear.bias)
    # and it reads back as the same heads
    loaded = MedusaHeads.from_pretrained(tmp_path / "vllm", model=model)
    hidden = hidden_of(model)
    assert torch.equal(loaded(hidden, model.lm_head), heads(hidden, model.lm_head))


def test_vllm_export_with_own_lm_heads_writes_one_per_head(tmp_path):
    model = tiny_model()
    heads = trained_like(MedusaHeads.for_model(model, num_heads=2, num_layers=1, share_lm_head=False))
    heads.save_pretrained(tmp_path, format="vllm")  # no base needed: every projection is in the heads
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["original_lm_head"] is False and config["num_heads"] == 2
    weights = load_file(str(tmp_path / "model.safetensors"))
    assert sorted(weights) == [
        "blocks.0.layers.0.bias", "blocks.0.layers.0.weight", "blocks.1.layers.0.bias", "blocks.1.layers.0.weight",
        "lm_heads.0.weight", "lm_heads.1.weight",
    ]
    assert torch.equal(weights["lm_heads.1.weight"], heads.lm_heads[1].weight)
    loaded = MedusaHeads.from_pretrained(tmp_path, model=model)
    hidden = hidden_of(model)
    assert torch.equal(loaded(hidden, model.lm_head), heads(hidden, model.lm_head))


def test_vllm_export_refuses_another_base(tmp_path):
    heads = MedusaHeads.for_model(tiny_model())
    with pytest.raises(ValueError, match="different base model"):
        heads.save_pretrained(tmp_path, format="vllm", model=tiny_model(seed=1))


def test_unknown_format_name():
    with pytest.raises(ValueError, match="unknown heads format"):
        MedusaHeads.for_model(tiny_model()).save_pretrained("/nonexistent", format="medusa")
