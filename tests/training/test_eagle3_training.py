"""EAGLE-3 training (`--kind eagle --feature-layers`): records carry the base's feature layers, the loss is the
distribution only over the head's own unrolled predictions, and `--init` of a final-state head warm-starts it."""
import json

import pytest
import torch

from heads.eagle import EagleHead
from heads.eagle_module import default_feature_layers
from selfspec import SelfSpecModel
from selfspec.target import TargetModel
from tests.conftest import random_prompt, tiny_model
from tests.training.test_heads import model_dir, settings, texts  # noqa: F401  (fixtures)
from training.head_settings import parse_args
from training.heads import run
from training.recipes import EagleRecipe, recipe_for, resolve_feature_layers


def test_feature_layers_flag_takes_auto_or_indices_and_refuses_others():
    auto = parse_args(["--model", "m", "--out", "o", "--chat", "--kind", "eagle", "--feature-layers", "auto"])
    listed = parse_args(["--model", "m", "--out", "o", "--chat", "--kind", "eagle", "--feature-layers", "27", "2",
                         "15"])
    assert recipe_for(auto, 30).feature_layers == (2, 15, 27)  # EAGLE-3's low, middle and high layers
    assert recipe_for(listed, 30).feature_layers == (2, 15, 27)  # ascending, as vLLM concatenates them
    assert EagleRecipe(feature_layers=(3, 1)).feature_layers == (1, 3)
    assert default_feature_layers(4) == (1, 2) and default_feature_layers(32) == (2, 16, 29)
    # three distinct layers (what vLLM's EAGLE-3 reads) from 7 layers on, as docs/training.md says
    assert [len(default_feature_layers(n)) for n in range(2, 9)] == [1, 2, 2, 1, 2, 3, 3]
    with pytest.raises(SystemExit):
        parse_args(["--model", "m", "--out", "o", "--chat", "--kind", "medusa", "--feature-layers", "auto"])
    with pytest.raises(ValueError, match="beyond"):
        resolve_feature_layers(("2", "40"), 30)


def test_records_carry_the_feature_layers_and_the_loss_has_no_feature_regression():
    from training import features as feature_data
    from training import head_data
    from training.recipes import Teacher

    model = tiny_model(num_layers=4)
    target = TargetModel(model)
    target.set_feature_layers((1, 3))
    rows = list(head_data.continue_tokens(model, torch.randint(3, target.vocab_size, (4, 4)), 12))
    records = feature_data.compute_records(target, rows, progress=False)
    out = model.get_decoder()(input_ids=rows[0][None], output_hidden_states=True)
    expected = torch.cat([out.last_hidden_state, out.hidden_states[1], out.hidden_states[3]], dim=-1)[0, :-1]
    torch.testing.assert_close(records[0]["hidden"], expected)
    stream = feature_data.PositionStream(records)
    head = EagleHead.for_model(model, feature_layers=(1, 3))
    batch = stream.batch(torch.tensor([0, 3]), 10)
    teacher = Teacher(target, None)
    three = EagleRecipe(passes=3, feature_layers=(1, 3))
    loss, top1 = three.loss(head, batch, teacher)
    assert len(top1) == 3 and torch.isfinite(loss)
    # no regression term: the feature weight changes nothing for a multi-layer head
    same, _ = EagleRecipe(passes=3, feature_layers=(1, 3), feature_weight=7.0).loss(head, batch, teacher)
    torch.testing.assert_close(loss, same)


def test_init_of_a_final_state_head_warm_starts_an_eagle3_head_that_trains_and_drafts(tmp_path, model_dir, texts):
    common = dict(kind="eagle", data=(str(texts / "train.txt"),), eval_data=(str(texts / "heldout.txt"),),
                  eagle_passes=2, lr=1e-2)
    old = tmp_path / "eagle"
    run(settings(model_dir, old, max_steps=30, **common), progress_bar=False)
    old_eval = json.loads((old / "eval.json").read_text())["heldout"]
    new = tmp_path / "eagle3"
    result = run(settings(model_dir, new, max_steps=30, feature_layers=("auto",), init=str(old), **common),
                 progress_bar=False)
    log = json.loads((new / "train_log.json").read_text())
    # widened, the head drafts exactly as the head it came from (its feature fc takes the final state)...
    assert log["initial_eval"]["heldout"]["top1"] == pytest.approx(old_eval["top1"], abs=1e-3)
    # ...and training from there improves it
    assert result["heldout"]["mean_accepted_length"] > old_eval["mean_accepted_length"], (old_eval, result)

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    head = EagleHead.from_pretrained(new, model=model)
    assert head.config.feature_layers == (1, 2)
    spec = SelfSpecModel(model, heads=head)
    assert spec.target.feature_layers == (1, 2)
    prompt = random_prompt(6)
    plain = model.generate(prompt, max_new_tokens=16, do_sample=False)
    generated = spec.generate(prompt, max_new_tokens=16, num_draft_tokens=3)
    assert torch.equal(generated.sequences, plain)
    assert generated.stats.drafted > 0 and generated.stats.accepted > 0, generated.stats
    with pytest.raises(ValueError, match="feature layers"):  # a multi-layer head is not warm-started as another
        recipe_for(settings(model_dir, tmp_path / "x", feature_layers=("1",), **common), 3).load_head(new, model)


def test_the_eagle3_layout_trains_with_its_own_lm_head_and_exports_to_the_speculators_format(tmp_path, model_dir,
                                                                                              texts):
    """`--eagle-layout eagle3 --feature-layers 2 0 1` trains the speculators format's EAGLE-3 (its own LM head over
    the draft vocabulary too) on three layers of the 3-layer base, kept ascending; the result drafts exactly and
    survives export to that format (which `auto`'s two layers of a base that small would not: vLLM reads three)."""
    common = dict(kind="eagle", data=(str(texts / "train.txt"),), eval_data=(str(texts / "heldout.txt"),),
                  eagle_passes=2, lr=1e-2, eagle_layout="eagle3", feature_layers=("2", "0", "1"), draft_vocab_size=48)
    out = tmp_path / "eagle3"
    result = run(settings(model_dir, out, max_steps=20, **common), progress_bar=False)
    log = json.loads((out / "train_log.json").read_text())
    assert result["heldout"]["top1"][0] > log["initial_eval"]["heldout"]["top1"][0], (log["initial_eval"], result)

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    head = EagleHead.from_pretrained(out, model=model)
    assert head.config.layout == "eagle3" and head.config.feature_layers == (0, 1, 2) and len(head.draft_vocab) == 48
    assert torch.equal(head.draft_vocab, head.draft_vocab.sort().values)  # ascending, as the format's d2t holds ids
    head.save_pretrained(tmp_path / "speculators", format="speculators", model=model)
    exported = EagleHead.from_pretrained(tmp_path / "speculators", model=model)
    prompt = random_prompt(6)
    plain = model.generate(prompt, max_new_tokens=16, do_sample=False)
    for drafting in (head, exported):
        generated = SelfSpecModel(model, heads=drafting).generate(prompt, max_new_tokens=16, num_draft_tokens=3)
        assert torch.equal(generated.sequences, plain)
        assert generated.stats.drafted > 0, generated.stats
    with pytest.raises(ValueError, match="'eagle3' head starts fresh"):  # --init of another layout
        recipe_for(settings(model_dir, tmp_path / "x", **common), 3).load_head(
            _selfspec_head_dir(model, tmp_path / "plain"), model)
    with pytest.raises(ValueError, match="pass --feature-layers auto"):
        settings(model_dir, tmp_path / "y", **{**common, "feature_layers": ()})


def _selfspec_head_dir(model, directory):
    EagleHead.for_model(model).save_pretrained(directory)
    return directory
