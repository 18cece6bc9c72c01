"""python -m training.heads on a tiny model: data forms and errors, the offsets, training raises agreement,
checkpoints load and resume exactly, --eval-only, the exit adapter."""
import json
from dataclasses import asdict, replace
from types import SimpleNamespace

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from heads import ExitAdapter, MedusaHeads
from tests.conftest import VOCAB, random_prompt, tiny_model
from tests.test_shipped_files import machine_paths
from training import head_data
from training.features import Batch
from training.head_settings import HeadSettings, parse_args
from training.heads import CHECKPOINT_DIR, SETTINGS_NAME, _check_resume, run
from training.recipes import EagleRecipe, MedusaRecipe, _chain_summary, recipe_for


def word_tokenizer() -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer over "w3".."w95" (ids 3..95), so text files map onto the tiny vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<bos>": 0, "<eos>": 1, "<pad>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")


def as_text(ids) -> str:
    return " ".join(f"w{i}" for i in ids)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("model")
    model = tiny_model(dtype=torch.float32, num_layers=3)
    with torch.no_grad():  # sharpen: a random model's near-uniform distributions make its argmax a coin toss
        model.lm_head.weight.mul_(10.0)
    model.save_pretrained(directory)
    word_tokenizer().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def texts(tmp_path_factory, model_dir):
    """The base's own greedy continuations of random prompts, as text: train.txt and heldout.txt."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompts = torch.cat([random_prompt(4, seed=s) for s in range(48)])  # [48, 4]
    rows = head_data.continue_tokens(model, prompts, 60)  # [48, 64]
    directory = tmp_path_factory.mktemp("text")
    (directory / "train.txt").write_text("\n".join(as_text(r.tolist()) for r in rows[:40]))
    (directory / "heldout.txt").write_text("\n".join(as_text(r.tolist()) for r in rows[40:]))
    return directory


def settings(model_dir, out, **overrides) -> HeadSettings:
    defaults = dict(
        model=str(model_dir), out=str(out), seq_len=32, batch_size=8, max_steps=60, time_budget=0, lr=3e-2,
        warmup_steps=2, eval_tokens=256, prompt_len=8, save_every=0, threads=1,
    )
    return HeadSettings(**{**defaults, **overrides})


def test_flags_map_one_to_one_onto_settings():
    parsed = parse_args([
        "--model", "m", "--out", "o", "--data", "a.txt", "dir", "--no-share-lm-head", "--kind", "exit-adapter",
        "--exit-layer", "2", "--resume", "--max-steps", "5", "--time-budget", "0", "--draft-vocab-size", "64",
    ])
    assert parsed.data == ("a.txt", "dir") and parsed.share_lm_head is False and parsed.resume is True
    assert (parsed.kind, parsed.exit_layer, parsed.max_steps, parsed.draft_vocab_size) == ("exit-adapter", 2, 5, 64)
    assert parse_args(["--model", "m", "--out", "o", "--data", "x"]).share_lm_head is True  # shared by default
    assert parse_args(["--model", "m", "--out", "o", "--chat", "--kind", "eagle"]).kind == "eagle"


def test_the_eagle_layout_flag_reaches_the_new_head():
    """`--eagle-layout eagle1` trains a head in the layout vLLM serves; the default stays selfspec's own."""
    plain = parse_args(["--model", "m", "--out", "o", "--chat", "--kind", "eagle"])
    exportable = parse_args(["--model", "m", "--out", "o", "--chat", "--kind", "eagle", "--eagle-layout", "eagle1"])
    assert (plain.eagle_layout, exportable.eagle_layout) == ("selfspec", "eagle1")
    for settings_, layout in ((plain, "selfspec"), (exportable, "eagle1")):
        head = recipe_for(settings_, 2).new_head(tiny_model(), settings_, None)
        assert head.config.layout == layout


def scripted_batch(num_records: int = 2, length: int = 10, hidden: int = 4) -> Batch:
    torch.manual_seed(0)
    record = torch.arange(num_records).repeat_interleave(length // num_records)[None]  # [1, L]
    return Batch(torch.randn(1, length, hidden), torch.zeros(1, length, dtype=torch.long), record,
                 torch.ones(1, length, dtype=torch.bool))


class IdentityTeacher:
    """A teacher whose 'LM head' is the identity over a hidden size of 4 (so features are logits)."""

    draft_vocab = None

    def logits(self, hidden):
        return hidden

    def probs(self, hidden):
        return hidden.float().softmax(-1)

    def greedy(self, hidden):
        return hidden.argmax(-1)

    def to_full_ids(self, ids):
        return ids


def test_medusa_loss_targets_the_base_distribution_k_plus_one_ahead_within_one_record():
    """A head that outputs h_{t+1+k} at t has only the entropy as loss and perfect agreement: the offsets. Positions
    whose target lies in another record are masked."""
    batch = scripted_batch()
    features = batch.features

    class Oracle(torch.nn.Module):
        config = type("C", (), {"share_lm_head": True})()

        def forward(self, hidden, base_logits):  # head k at t returns the feature k+1 ahead
            states = [torch.cat([features[:, 1 + k :], features[:, : 1 + k]], 1) for k in range(3)]
            return base_logits(torch.stack(states, dim=-2))

    recipe = MedusaRecipe(num_heads=3, head_loss_decay=1.0)
    loss, top1 = recipe.loss(Oracle(), batch, IdentityTeacher())
    expected = 0
    for k in range(3):
        n = 10 - 1 - k
        mask = batch.same_record(1 + k)[:, :n]
        target = features[:, 1 + k : 1 + k + n].softmax(-1)
        entropy = -(target * target.log()).sum(-1)
        expected += (entropy * mask).sum() / mask.sum()
    torch.testing.assert_close(loss, expected)
    assert top1 == [1.0, 1.0, 1.0]


def test_eagle_chain_counts_each_draft_at_its_own_position_up_to_the_first_miss():
    """_chain_summary: draft j of a chain started at t is scored at t + j; the chain stops at its first miss."""
    m0 = torch.tensor([[True, True, False, True]])
    m1 = torch.tensor([[True, False, True, True]])  # m1[t + 1] scores the second draft of a chain started at t
    ones = torch.ones_like(m0)
    summary = _chain_summary([m0, m1], [ones, ones])
    # chains from t=0: m0[0] & m1[1] = False; t=1: m0[1] & m1[2] = True; t=2: m0[2] False; (t=3 has no second draft)
    assert summary["chain_acceptance"] == [0.75, 0.25]
    assert summary["mean_accepted_length"] == 2.0
    # the planted bug this catches: scoring the second draft at t instead of t + 1 would give 0.5
    assert float((m0 & m1).float().mean()) == 0.5


def test_eagle_training_passes_feed_the_predicted_features_back():
    """Pass 2 reads pass 1's prediction for position t-1 as its feature at t (and the real h_0 at position 0)."""
    seen = []

    class Recorder(torch.nn.Module):
        def new_cache(self):
            return None

        def forward(self, features, next_embeddings, positions, cache=None, attention_mask=None):
            seen.append(features.clone())
            return features + 1.0

    class Teacher_(IdentityTeacher):
        embed = torch.nn.Embedding(8, 4)

    batch = scripted_batch()
    list(EagleRecipe(passes=2)._passes(Recorder(), batch, Teacher_()))
    torch.testing.assert_close(seen[0], batch.features)
    torch.testing.assert_close(seen[1][:, 0], batch.features[:, 0])
    torch.testing.assert_close(seen[1][:, 1:], batch.features[:, :-1] + 1.0)


def test_eagle_training_pass_j_computes_draft_j_plus_1_as_the_drafter_does():
    """Pass j's prediction at row t equals what the drafter computes for draft j+1 of a chain whose last real
    feature is h_{t-j}: the head reads the real features up to t-j into its cache, then runs on its own predictions
    (attending to the real entries and to the chain's own, never to predictions made from other chains' starts)."""
    from heads.eagle import EagleHead

    model = tiny_model()  # float64
    head = EagleHead.for_model(model).eval()
    torch.manual_seed(1)
    with torch.no_grad():  # away from the identity start, so every input and attended entry changes the output
        for parameter in head.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    length, hidden = 12, model.config.hidden_size
    embed = model.get_input_embeddings()
    batch = Batch(torch.randn(1, length, hidden, dtype=torch.float64), random_prompt(length, seed=3),
                  torch.zeros(1, length, dtype=torch.long), torch.ones(1, length, dtype=torch.bool))

    teacher = SimpleNamespace(embed=embed)  # all `_passes` reads of a teacher
    passes = 3
    checked = 0
    with torch.no_grad():
        for j, predicted, mask in EagleRecipe(passes=passes)._passes(head, batch, teacher):
            assert mask[0].tolist() == [t >= j for t in range(length - 1)]  # a chain needs j real rows before it
            for t in range(j, length - 1):
                start = t - j  # the chain's last real feature
                cache = head.new_cache()
                positions = torch.arange(start + 1)[None]
                feature = head(batch.features[:, : start + 1], embed(batch.next_ids[:, : start + 1]), positions,
                               cache)[:, -1:]
                for i in range(1, j + 1):
                    position = torch.tensor([[start + i]])
                    feature = head(feature, embed(batch.next_ids[:, start + i : start + i + 1]), position, cache)
                torch.testing.assert_close(predicted[:, t], feature[:, 0])
                checked += 1
    assert checked == sum(length - 1 - j for j in range(passes))


def test_data_forms_split_and_errors(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("w3 w4")
    (tmp_path / "docs" / "b.md").write_text("w5")
    (tmp_path / "records.jsonl").write_text(json.dumps({"text": "w6 w7"}) + "\n\n" + json.dumps({"text": "w8"}) + "\n")
    documents = head_data.read_documents((str(tmp_path / "docs"), str(tmp_path / "records.jsonl")), "**/*.txt")
    assert [d.text for d in documents] == ["w3 w4", "w6 w7", "w8"]
    assert head_data.encode(word_tokenizer(), documents).tolist() == [3, 4, 1, 6, 7, 1, 8, 1]
    train, heldout = head_data.split_documents(documents, 0.5)
    assert sorted(d.name for d in train + heldout) == sorted(d.name for d in documents)
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(ValueError, match="no text in --data"):
        head_data.read_documents((str(tmp_path / "empty.txt"),), "*")
    with pytest.raises(ValueError, match="no files match --glob"):
        head_data.read_documents((str(tmp_path / "docs"),), "*.rst")
    with pytest.raises(FileNotFoundError, match="no such file"):
        head_data.read_documents((str(tmp_path / "nothing"),), "*")
    (tmp_path / "bad.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(ValueError, match='field "text"'):
        head_data.read_documents((str(tmp_path / "bad.jsonl"),), "*")


def test_empty_data_and_a_window_past_the_context_fail_clearly(tmp_path, model_dir, texts):
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="no text in --data"):
        run(settings(model_dir, tmp_path / "a", data=(str(tmp_path / "empty.txt"),)), progress_bar=False)
    with pytest.raises(ValueError, match="longer than the model's context of 512"):
        run(settings(model_dir, tmp_path / "b", data=(str(texts / "train.txt"),), seq_len=600), progress_bar=False)
    (tmp_path / "short.txt").write_text("w3 w4 w5")
    with pytest.raises(ValueError, match="too few for a training window"):
        run(settings(model_dir, tmp_path / "c", data=(str(tmp_path / "short.txt"),)), progress_bar=False)
    with pytest.raises(ValueError, match="--data PATH..., --chat .* or --self-generate"):
        settings(model_dir, tmp_path / "d")


def test_training_raises_agreement_and_the_heads_load_everywhere(tmp_path, model_dir, texts):
    out = tmp_path / "heads"
    result = run(
        settings(model_dir, out, data=(str(texts / "train.txt"),), eval_data=(str(texts / "heldout.txt"),)),
        progress_bar=False,
    )
    log = json.loads((out / "train_log.json").read_text())
    for name in ("train_settings.json", "train_log.json", "config.json"):  # shipped beside the heads: no tmp_path
        assert machine_paths(json.loads((out / name).read_text())) == [], name
    assert log["settings"]["out"] == "heads" and log["settings"]["data"] == ["train.txt"]
    before, after = log["initial_eval"]["heldout"], result["heldout"]
    # The text is the base's greedy output, mostly short cycles: far heads start high by luck (a fresh head k
    # guesses token t+1 for t+2+k, right on a cycle of period k+1), the first head does not.
    assert after["top1"][0] > before["top1"][0] + 0.15, (before, after)
    assert after["mean_accepted_length"] > before["mean_accepted_length"] + 0.3, (before, after)
    assert json.loads((out / "eval.json").read_text()) == result
    assert set(result) == {"kind", "heldout"}

    from transformers import AutoModelForCausalLM

    from selfspec.engine import SelfSpecModel

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    heads = MedusaHeads.from_pretrained(out, model=model)
    assert heads.num_heads == 4 and heads.config.share_lm_head
    spec = SelfSpecModel.from_pretrained(model_dir, heads=str(out), dtype=torch.float32)
    prompt = random_prompt(6)
    plain = model.generate(prompt, max_new_tokens=12, do_sample=False)
    assert torch.equal(spec.generate(prompt, max_new_tokens=12).sequences, plain)
    # every head consulted at a fixed k: the trained heads draft inside the engine, and are right at times
    spec = SelfSpecModel(model, heads=heads, min_draft_confidence=0.0)
    generated = spec.generate(prompt, max_new_tokens=12, num_draft_tokens=3)
    assert torch.equal(generated.sequences, plain)
    assert generated.stats.drafted > 0 and generated.stats.accepted > 0, generated.stats

    # heads of another base are refused at load
    with pytest.raises(ValueError, match="different base model"):
        MedusaHeads.from_pretrained(out, model=tiny_model(seed=5, num_layers=3))

    # --eval-only re-measures the saved heads and rewrites eval.json
    (out / "eval.json").unlink()
    again = run(settings(model_dir, out, data=(str(texts / "train.txt"),), eval_data=(str(texts / "heldout.txt"),),
                         eval_only=True), progress_bar=False)
    assert again == result and (out / "eval.json").is_file()

    with pytest.raises(FileExistsError, match="--resume"):
        run(settings(model_dir, out, data=(str(texts / "train.txt"),)), progress_bar=False)


def test_resume_continues_the_same_run_exactly(tmp_path, model_dir, texts):
    common = dict(data=(str(texts / "train.txt"),), eval_data=(str(texts / "heldout.txt"),), max_steps=6, save_every=3,
                  num_heads=2)
    straight = tmp_path / "straight"
    run(settings(model_dir, straight, **common), progress_bar=False)
    interrupted = tmp_path / "interrupted"
    run(settings(model_dir, interrupted, **common), progress_bar=False, stop_after=4)  # dies after step 4
    assert (interrupted / "checkpoint").is_dir() and not (interrupted / "eval.json").exists()
    with pytest.raises(ValueError, match="settings differ from it: lr"):
        run(settings(model_dir, interrupted, resume=True, **{**common, "lr": 0.5}), progress_bar=False)
    run(settings(model_dir, interrupted, resume=True, **common), progress_bar=False)  # continues from step 3
    a, b = MedusaHeads.from_pretrained(straight), MedusaHeads.from_pretrained(interrupted)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)
    log = json.loads((interrupted / "train_log.json").read_text())
    assert log["steps"] == 6 and "initial_eval" in log


def test_resume_accepts_settings_written_with_absolute_paths(tmp_path, model_dir):
    """A run started before train_settings.json shortened its paths resumes: both sides are compared shortened."""
    out = tmp_path / "older"
    (out / CHECKPOINT_DIR).mkdir(parents=True)
    older = settings(model_dir, out, data=(str(tmp_path / "train.txt"),))
    (out / SETTINGS_NAME).write_text(json.dumps(asdict(older)))  # the absolute paths as an older version wrote them
    _check_resume(replace(older, resume=True), out)
    with pytest.raises(ValueError, match="settings differ from it: lr"):
        _check_resume(replace(older, resume=True, lr=0.5), out)


def test_self_generate_and_exit_adapter(tmp_path, model_dir, texts):
    out = tmp_path / "adapter"
    result = run(
        settings(model_dir, out, kind="exit-adapter", exit_layer=1, data=(str(texts / "train.txt"),),
                 eval_data=(str(texts / "heldout.txt"),), self_generate=16, max_steps=30),
        progress_bar=False,
    )
    log = json.loads((out / "train_log.json").read_text())
    assert log["train_positions_available"] == 16 * (32 - 1)  # 16 windows, each predicting 31 next tokens
    before, after = log["initial_eval"]["heldout"], result["heldout"]
    assert before["top1"][0] == before["plain_early_exit_top1"]  # a fresh adapter is plain early exit
    assert after["top1"][0] > before["top1"][0], (before, after)
    adapter = ExitAdapter.from_pretrained(out)
    assert adapter.exit_layer == 1


def test_self_generation_without_data_samples_and_holds_out_its_own_sequences(tmp_path, model_dir):
    result = run(settings(model_dir, tmp_path / "a", self_generate=8, max_steps=2), progress_bar=False)
    log = json.loads((tmp_path / "a" / "train_log.json").read_text())
    assert log["train_records"] == 8 and log["heldout_records"] == 8  # eval_tokens 256 = 8 sampled sequences of 32
    assert result["heldout"]["positions"] > 0
    with pytest.raises(ValueError, match="same sequence every time"):
        run(settings(model_dir, tmp_path / "b", self_generate=4, self_generate_temperature=0.0), progress_bar=False)
