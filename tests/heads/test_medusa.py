"""MedusaHeads and ExitAdapter: identity at birth, distinct weights, exact checkpoints, clear mismatch errors."""
import json

import pytest
import torch

from heads import EagleHead, ExitAdapter, MedusaHeads
from selfspec import SelfSpecModel
from selfspec.target import TargetModel
from tests.conftest import random_prompt, tiny_model


def last_hidden(model, ids):
    return model.model(input_ids=ids).last_hidden_state  # [1, T, hidden], post-norm


@pytest.mark.parametrize("family", ["llama", "gemma"])  # gemma: a tied, scaled embedding
def test_fresh_shared_heads_are_the_identity(family):
    model = tiny_model(family)
    target = TargetModel(model)
    hidden = last_hidden(model, random_prompt())[0]  # [T, hidden]
    heads = MedusaHeads.for_model(model, num_heads=3, num_layers=2)
    logits = heads(hidden, target.logits)  # [T, 3, vocab]
    assert logits.shape == (hidden.shape[0], 3, model.config.vocab_size)
    for k in range(3):
        torch.testing.assert_close(logits[:, k], target.logits(hidden), rtol=0, atol=0)


def test_fresh_own_lm_heads_start_as_copies_of_the_base_lm_head():
    model = tiny_model()
    heads = MedusaHeads.for_model(model, num_heads=2, share_lm_head=False)
    hidden = last_hidden(model, random_prompt())[0]
    torch.testing.assert_close(heads(hidden, model.lm_head)[:, 1], model.lm_head(hidden), rtol=0, atol=0)
    # copies, not the base tensor itself: training them must not touch the base
    assert heads.lm_heads[0].weight.data_ptr() != model.lm_head.weight.data_ptr()


def test_every_head_and_block_owns_distinct_weights():
    heads = MedusaHeads.for_model(tiny_model(), num_heads=3, num_layers=2, share_lm_head=False)
    params = list(heads.parameters())
    assert len({p.data_ptr() for p in params}) == len(params) == 3 * 2 * 2 + 3
    modules = [block for head in heads.blocks for block in head]
    assert len({id(m) for m in modules}) == 6
    with torch.no_grad():
        heads.blocks[0][0].linear.weight.fill_(1.0)
    assert heads.blocks[0][1].linear.weight.abs().sum() == 0 and heads.blocks[1][0].linear.weight.abs().sum() == 0


@pytest.mark.parametrize("share_lm_head", [True, False])
def test_save_load_round_trip_is_exact(tmp_path, share_lm_head):
    model = tiny_model()
    heads = MedusaHeads.for_model(model, num_heads=2, num_layers=2, share_lm_head=share_lm_head)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn_like(p))
    heads.save_pretrained(tmp_path)
    loaded = MedusaHeads.from_pretrained(tmp_path, model=model)
    assert loaded.config == heads.config
    for (name, a), (_, b) in zip(heads.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    hidden = last_hidden(model, random_prompt())[0]
    assert torch.equal(heads(hidden, model.lm_head), loaded(hidden, model.lm_head))


def test_loading_onto_a_model_moves_heads_to_its_dtype(tmp_path):
    MedusaHeads.for_model(tiny_model()).save_pretrained(tmp_path)
    loaded = MedusaHeads.from_pretrained(tmp_path, model=tiny_model(dtype=torch.float32))
    assert next(loaded.parameters()).dtype == torch.float32


@pytest.mark.parametrize(
    "other, message",
    [
        (dict(hidden=48), "hidden size 32 but the model has 48"),
        (dict(vocab_size=80), "vocabulary of 96 tokens but the model has 80"),
        (dict(seed=1), "different base model"),
    ],
)
def test_heads_of_another_base_fail_clearly(tmp_path, other, message):
    MedusaHeads.for_model(tiny_model()).save_pretrained(tmp_path)
    seed = other.pop("seed", 0)
    with pytest.raises(ValueError, match=message):
        MedusaHeads.from_pretrained(tmp_path, model=tiny_model(seed=seed, **other))


def test_check_base_false_overrides_identity_but_not_shapes(tmp_path):
    MedusaHeads.for_model(tiny_model()).save_pretrained(tmp_path)
    MedusaHeads.from_pretrained(tmp_path, model=tiny_model(seed=1), check_base=False)  # same shapes: allowed
    with pytest.raises(ValueError, match="hidden size"):  # different shapes can never work
        MedusaHeads.from_pretrained(tmp_path, model=tiny_model(hidden=48), check_base=False)


def test_not_a_heads_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        MedusaHeads.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(FileNotFoundError, match="neither a selfspec heads directory"):
        MedusaHeads.from_pretrained(tmp_path)


def test_an_eagle_head_directory_is_not_medusa_heads(tmp_path):
    model = tiny_model()
    EagleHead.for_model(model).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="holds an EAGLE head, not Medusa heads: load it with "
                                         "EagleHead.from_pretrained; in SelfSpecModel use drafter='eagle' or leave "
                                         "drafter unset"):
        MedusaHeads.from_pretrained(tmp_path, model=model)
    with pytest.raises(ValueError, match="use drafter='eagle' or leave drafter unset"):
        SelfSpecModel(model, drafter="medusa", heads=str(tmp_path))
    assert type(SelfSpecModel(model, heads=str(tmp_path)).drafter).__name__ == "EagleDrafter"  # left unset: its kind


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_a_directory_whose_config_disagrees_with_its_weights_or_lacks_them(tmp_path, kind):
    model = tiny_model()
    head_class = MedusaHeads if kind == "medusa" else EagleHead
    head_class.for_model(model).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    if kind == "medusa":
        config["num_heads"] += 1
    else:
        config["num_layers"] += 1
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"its config.json does not describe its model.safetensors \(.*Missing "
                                         r"key\(s\).*\); was one of them edited"):
        head_class.from_pretrained(tmp_path, model=model)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors in .*: the directory holds a config.json but not "
                                                "its weights"):
        head_class.from_pretrained(tmp_path, model=model)


def test_exit_adapter_is_the_identity_at_birth_and_round_trips(tmp_path):
    model = tiny_model(num_layers=3)
    adapter = ExitAdapter.for_model(model, exit_layer=1, num_layers=2)
    hidden = model.model(input_ids=random_prompt(), output_hidden_states=True).hidden_states[1]
    assert torch.equal(adapter(hidden), hidden)
    with torch.no_grad():
        for p in adapter.parameters():
            p.add_(0.1)
    adapter.save_pretrained(tmp_path)
    loaded = ExitAdapter.from_pretrained(tmp_path, model=model)
    assert loaded.exit_layer == 1 and torch.equal(loaded(hidden), adapter(hidden))
    with pytest.raises(ValueError, match="different base model"):
        ExitAdapter.from_pretrained(tmp_path, model=tiny_model(num_layers=3, seed=1))
    with pytest.raises(ValueError, match="exit_layer must be in"):
        ExitAdapter.for_model(model, exit_layer=3)
