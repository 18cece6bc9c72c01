"""EAGLE-3 heads (`EagleConfig.feature_layers`): they fuse the base's final state with the named layers' states,
feed their own predictions back unfused, round-trip through their checkpoint, start as "take the final state", and
widen a final-state head without changing what it computes; layers given in any order are kept ascending. The modules
import without a cycle."""
import ast
import json
from pathlib import Path

import pytest
import torch

from heads.eagle import EagleHead
from heads.eagle_module import EagleConfig
from tests.conftest import tiny_model

LAYERS = (1, 2)


def noisy(head, scale=0.1, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return head.eval()


def wide_rows(model, length=5, layers=LAYERS):
    """[1, length, 3H] the rows the target hands an EAGLE-3 head of LAYERS: final state, hidden_states 1 and 2 (or
    those of `layers`)."""
    out = model.get_decoder()(input_ids=torch.arange(3, 3 + length)[None], output_hidden_states=True)
    return torch.cat([out.last_hidden_state] + [out.hidden_states[l] for l in layers], dim=-1).detach()


def test_a_fresh_eagle3_head_computes_what_a_fresh_final_state_head_does():
    model = tiny_model(num_layers=4)
    wide, plain = EagleHead.for_model(model, feature_layers=LAYERS), EagleHead.for_model(model)
    rows = wide_rows(model)
    embeddings = model.get_input_embeddings()(torch.arange(4, 9)[None]).detach()
    positions = torch.arange(5)[None]
    torch.testing.assert_close(wide(rows, embeddings, positions), plain(rows[..., :32], embeddings, positions))
    assert wide.feature_fc.weight.shape == (32, 96) and wide.config.feature_width == 96


def test_widening_keeps_a_trained_head_and_its_predictions_feed_back_unfused():
    model = tiny_model(num_layers=4)
    plain = noisy(EagleHead.for_model(model))
    wide = EagleHead.widened(plain, LAYERS, model)
    rows = wide_rows(model)
    embeddings = model.get_input_embeddings()(torch.arange(4, 9)[None]).detach()
    positions = torch.arange(5)[None]
    predicted = plain(rows[..., :32], embeddings, positions)
    torch.testing.assert_close(wide(rows, embeddings, positions), predicted)
    # a predicted feature (H wide) goes in as it is, as plain's does
    torch.testing.assert_close(wide(predicted, embeddings, positions), plain(predicted, embeddings, positions))
    noisy(wide, seed=3)  # the layers' slots now matter
    assert not torch.allclose(wide(rows, embeddings, positions), wide(torch.cat(
        [rows[..., :32], torch.zeros_like(rows[..., 32:])], -1), embeddings, positions))
    with pytest.raises(ValueError, match="already reads feature layers"):
        EagleHead.widened(wide, LAYERS, model)


def test_checkpoint_round_trip_and_refusals(tmp_path):
    model = tiny_model(num_layers=4)
    head = noisy(EagleHead.for_model(model, feature_layers=LAYERS))
    head.save_pretrained(tmp_path)
    loaded = EagleHead.from_pretrained(tmp_path, model=model)
    assert loaded.config.feature_layers == LAYERS and loaded.config.feature_width == 96
    rows = wide_rows(model)
    embeddings = model.get_input_embeddings()(torch.arange(4, 9)[None]).detach()
    torch.testing.assert_close(loaded(rows, embeddings, torch.arange(5)[None]),
                               head(rows, embeddings, torch.arange(5)[None]), rtol=0, atol=0)
    with pytest.raises(ValueError, match="lie beyond it"):  # layer 2 of a 2-layer base does not exist
        EagleHead.from_pretrained(tmp_path, model=tiny_model(num_layers=2), check_base=False)
    with pytest.raises(ValueError, match="width"):
        head(rows[..., :64], embeddings, torch.arange(5)[None])
    with pytest.raises(ValueError, match="'selfspec' or 'eagle3' layout"):
        EagleConfig(head.config.base, head.config.base_config, layout="eagle1", feature_layers=(1,))
    with pytest.raises(ValueError, match="distinct"):
        EagleHead.for_model(model, feature_layers=(1, 1))


def test_no_heads_module_imports_one_that_imports_it_back():
    """heads/eagle_module.py <- eagle_formats.py / eagle_speculators.py <- eagle.py, with no import back, even
    inside a function."""
    root = Path(__file__).resolve().parents[2] / "heads"
    imports = {}
    for path in root.glob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("heads"):
                names.add(node.module if node.module != "heads" else f"heads.{node.names[0].name}")
            elif isinstance(node, ast.Import):
                names |= {a.name for a in node.names if a.name.startswith("heads.")}
        imports[f"heads.{path.stem}"] = names - {f"heads.{path.stem}"}

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, (*seen, n))) for n in imports.get(start, ()))

    cycles = [m for m in imports if m != "heads.__init__" and reaches(m, m)]
    assert not cycles, {m: imports[m] for m in cycles}
    assert "heads.eagle_module" in imports["heads.eagle_formats"] and "heads.eagle" not in imports["heads.eagle_formats"]


def test_a_selfspec_layout_head_is_not_written_in_the_speculators_format(tmp_path):
    """The speculators format holds the 'eagle3' layout only (`tests/heads/test_eagle_speculators.py`)."""
    model = tiny_model(num_layers=4)
    head = EagleHead.for_model(model, feature_layers=LAYERS)
    with pytest.raises(ValueError, match="--eagle-layout eagle3"):
        head.save_pretrained(tmp_path / "out", format="speculators")
    with pytest.raises(ValueError, match="unknown EAGLE head format"):
        head.save_pretrained(tmp_path / "out", format="speculator")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("layout", ["selfspec", "eagle3"])
def test_feature_layers_given_in_any_order_are_kept_ascending_and_draft_as_the_sorted_ones(tmp_path, layout):
    """vLLM concatenates the auxiliary states in ascending layer order: a head asked for layers 3 1 2 is the head of
    1 2 3 (config, weights, drafts), and a checkpoint written for 3 1 2 (fc's column blocks and the per-slot norms in
    that order, as one trained before heads sorted them) loads as that same function."""
    from safetensors.torch import load_file, save_file

    from selfspec import SelfSpecModel
    from tests.conftest import random_prompt

    model = tiny_model(num_layers=4)
    heads = []
    for layers in ((3, 1, 2), (1, 2, 3)):
        torch.manual_seed(0)
        heads.append(noisy(EagleHead.for_model(model, layout=layout, feature_layers=layers)))
    given, ascending = heads
    assert given.config.feature_layers == (1, 2, 3)
    for name, tensor in ascending.state_dict().items():
        assert torch.equal(given.state_dict()[name], tensor), name
    outputs = [SelfSpecModel(model, heads=h).generate(random_prompt(6), max_new_tokens=12, eos_token_id=[])
               for h in heads]
    assert outputs[0].stats.drafted > 0 and torch.equal(outputs[0].sequences, outputs[1].sequences)
    # a checkpoint written in the order 3 1 2
    ascending.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "feature_layers": [3, 1, 2]}))
    state = load_file(tmp_path / "model.safetensors")
    first = 0 if layout == "eagle3" else 1  # "selfspec": slot 0 is the final state
    slots = list(range(first)) + [first + i for i in (2, 0, 1)]  # the slots of layers 3, 1, 2
    state["feature_fc.weight"] = torch.cat([state["feature_fc.weight"][:, 32 * i: 32 * (i + 1)] for i in slots], 1)
    if layout == "selfspec":
        norms = {i: state[f"slot_norms.{i}.weight"] for i in range(4)}
        state.update({f"slot_norms.{j}.weight": norms[i] for j, i in enumerate(slots)})
    save_file(state, tmp_path / "model.safetensors")
    loaded = EagleHead.from_pretrained(tmp_path, model=model)
    assert loaded.config.feature_layers == (1, 2, 3)
    rows = wide_rows(model, layers=(1, 2, 3))
    embeddings = model.get_input_embeddings()(torch.arange(4, 9)[None]).detach()
    torch.testing.assert_close(loaded(rows, embeddings, torch.arange(5)[None]),
                               ascending(rows, embeddings, torch.arange(5)[None]), rtol=0, atol=0)
