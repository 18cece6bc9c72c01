"""python -m training.heads on a tiny model: data forms and errors, the offsets, training raises agreement,
checkpoints load and resume exactly, --eval-only, the exit adapter."""
import json

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from heads import ExitAdapter, MedusaHeads
from selfspec.target import TargetModel
from tests.conftest import VOCAB, random_prompt, tiny_model
from training import head_data, head_recipe
from training.heads import HeadSettings, parse_args, run


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
        warmup_steps=2, eval_tokens=256, eval_continuations=4, prompt_len=8, save_every=0,
    )
    return HeadSettings(**{**defaults, **overrides})


def test_flags_map_one_to_one_onto_settings():
    parsed = parse_args([
        "--model", "m", "--out", "o", "--data", "a.txt", "dir", "--no-share-lm-head", "--kind", "exit-adapter",
        "--exit-layer", "2", "--labels", "next-token", "--resume", "--max-steps", "5", "--time-budget", "0",
    ])
    assert parsed.data == ("a.txt", "dir") and parsed.share_lm_head is False and parsed.resume is True
    assert (parsed.kind, parsed.exit_layer, parsed.labels, parsed.max_steps) == ("exit-adapter", 2, "next-token", 5)
    assert parse_args(["--model", "m", "--out", "o", "--data", "x"]).share_lm_head is True  # shared by default


def test_medusa_loss_targets_are_the_base_distribution_at_the_shifted_position():
    """A head that copies the base's logits at t+1+k has zero excess loss and perfect agreement: the offsets."""
    torch.manual_seed(0)
    base_logits = torch.randn(2, 10, 7)
    teacher = head_recipe.Teacher(hidden=torch.zeros(2, 10, 4), logits=base_logits)
    head_logits = torch.full((2, 10, 3, 7), -1e4)
    for k in range(3):
        head_logits[:, : 10 - 1 - k, k] = base_logits[:, 1 + k :]  # head k at t sees the base's logits at t+1+k
    loss, agreement = head_recipe.medusa_loss(
        lambda k, n: head_logits[:, :n, k], teacher, torch.zeros(2, 10, dtype=torch.long), [1, 1, 1]
    )
    entropy = sum(
        -(base_logits[:, 1 + k :].softmax(-1) * base_logits[:, 1 + k :].log_softmax(-1)).sum(-1).mean() for k in range(3)
    )
    torch.testing.assert_close(loss, entropy)
    assert agreement == [1.0, 1.0, 1.0]


def test_mean_accepted_length_counts_the_chain_up_to_the_first_miss():
    class Scripted(torch.nn.Module):
        """Heads whose logits are given per (position, head); ignore the hidden state."""

        num_heads = 2

        def __init__(self, logits):
            super().__init__()
            self.logits = logits

        def forward(self, hidden, base_logits):
            return self.logits[None, : hidden.shape[1]]

    model = tiny_model()
    target = TargetModel(model)
    window = random_prompt(6)
    greedy = model(window).logits.argmax(-1)[0]  # [6]
    logits = torch.zeros(4, 2, VOCAB, dtype=torch.float64)  # positions 0..3 (T - K = 4), 2 heads
    right = [(True, True), (True, False), (False, True), (False, False)]
    for t, (first, second) in enumerate(right):
        logits[t, 0, greedy[t + 1] if first else (greedy[t + 1] + 1) % VOCAB] = 1
        logits[t, 1, greedy[t + 2] if second else (greedy[t + 2] + 1) % VOCAB] = 1
    result = head_recipe.evaluate_medusa(Scripted(logits), target, window)
    assert result["top1"] == [0.5, 0.5] and result["chain_acceptance"] == [0.5, 0.25]
    assert result["mean_accepted_length"] == 1 + (2 + 1 + 0 + 0) / 4


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
    with pytest.raises(ValueError, match="--data PATH... or --self-generate"):
        settings(model_dir, tmp_path / "d")


def test_training_raises_agreement_and_the_heads_load_everywhere(tmp_path, model_dir, texts):
    out = tmp_path / "heads"
    result = run(
        settings(model_dir, out, data=(str(texts / "train.txt"),), eval_data=(str(texts / "heldout.txt"),)),
        progress_bar=False,
    )
    log = json.loads((out / "train_log.json").read_text())
    before, after = log["initial_eval"]["heldout_text"], result["heldout_text"]
    # The text is the base's greedy output, mostly short cycles: far heads start high by luck (a fresh head k
    # guesses token t+1 for t+2+k, right on a cycle of period k+1), the first head does not.
    assert after["top1"][0] > before["top1"][0] + 0.15, (before, after)
    assert after["mean_accepted_length"] > before["mean_accepted_length"] + 0.3, (before, after)
    assert json.loads((out / "eval.json").read_text()) == result
    assert set(result) == {"kind", "heldout_text", "greedy_continuations"}

    from transformers import AutoModelForCausalLM

    from selfspec.engine import SelfSpecModel

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    heads = MedusaHeads.from_pretrained(out, model=model)
    assert heads.num_heads == 4 and heads.config.share_lm_head
    spec = SelfSpecModel.from_pretrained(model_dir, heads=str(out), dtype=torch.float32)
    prompt = random_prompt(6)
    plain = model.generate(prompt, max_new_tokens=12, do_sample=False)
    assert torch.equal(spec.generate(prompt, max_new_tokens=12).sequences, plain)

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
                  eval_continuations=0, num_heads=2)
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


def test_self_generate_and_exit_adapter(tmp_path, model_dir, texts):
    out = tmp_path / "adapter"
    result = run(
        settings(model_dir, out, kind="exit-adapter", exit_layer=1, data=(str(texts / "train.txt"),),
                 eval_data=(str(texts / "heldout.txt"),), self_generate=16, max_steps=30),
        progress_bar=False,
    )
    log = json.loads((out / "train_log.json").read_text())
    assert log["train_tokens_available"] == 16 * 32
    before, after = log["initial_eval"]["heldout_text"], result["heldout_text"]
    assert before["top1"][0] == before["plain_early_exit_top1"]  # a fresh adapter is plain early exit
    assert after["top1"][0] > before["top1"][0], (before, after)
    adapter = ExitAdapter.from_pretrained(out)
    assert adapter.exit_layer == 1


def test_self_generation_without_data_samples_and_holds_out_its_own_sequences(tmp_path, model_dir):
    result = run(settings(model_dir, tmp_path / "a", self_generate=8, max_steps=2, eval_continuations=0),
                 progress_bar=False)
    assert result["heldout_text"]["positions"] == 8 * (32 - 4)  # eval_tokens 256 = 8 sampled windows of 32
    with pytest.raises(ValueError, match="same sequence every time"):
        run(settings(model_dir, tmp_path / "b", self_generate=4, self_generate_temperature=0.0), progress_bar=False)
