"""training.corpus and training.base on a tiny synthetic corpus: split, tokenizer, a few steps, load, generate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.test_shipped_files import machine_paths
from training import base, corpus


def _write_corpus(root: Path) -> Path:
    """~40 small library files plus test code and site-packages that the corpus must skip."""
    for index in range(40):
        body = "".join(
            f"def function_{index}_{j}(value, count={j}):\n"
            f"    \"\"\"Return value scaled by count.\"\"\"\n"
            f"    result = value * count + {index}\n"
            f"    return result\n\n\n"
            f"class Thing{index}{j}:\n    def method(self, x):\n        return x + {j}\n\n\n"
            for j in range(6)
        )
        package = root / f"package{index % 4}"
        package.mkdir(parents=True, exist_ok=True)
        (package / f"module_{index}.py").write_text(body)
    for excluded in ("test/test_thing.py", "package0/tests/helper.py", "package1/test_module.py",
                     "idlelib/idle_test/mock.py", "site-packages/thirdparty/lib.py"):
        path = root / excluded
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("self.assertEqual(1, 1)\n" * 20)
    return root


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory) -> Path:
    return _write_corpus(tmp_path_factory.mktemp("stdlib"))


def _tiny_settings(out: Path, root: Path, **overrides) -> base.BaseSettings:
    values = dict(
        out=str(out), corpus_root=str(root), hidden_size=32, num_layers=3, num_heads=2, num_kv_heads=1,
        intermediate_size=64, vocab_size=512, seq_len=32, batch_size=4, warmup_steps=2, time_budget=0,
        max_steps=6, eval_tokens=256, heldout_fraction=0.25, save_dtype="float32",
    )
    values.update(overrides)
    return base.BaseSettings(**values)


def test_corpus_skips_tests_and_site_packages(tiny_corpus):
    rel = [p.relative_to(tiny_corpus).as_posix() for p in corpus.stdlib_files(tiny_corpus)]
    assert len(rel) == 40
    assert not any("test" in r or "site-packages" in r for r in rel)
    assert corpus.is_test_path("lib2to3/tests/data/x.py") and corpus.is_test_path("json/test_x.py")
    assert not corpus.is_test_path("unittest/case.py")


def test_split_is_deterministic_and_disjoint(tiny_corpus):
    files = corpus.stdlib_files(tiny_corpus)
    train, heldout = corpus.split_files(files, 0.25, tiny_corpus)
    again = corpus.split_files(list(reversed(files)), 0.25, tiny_corpus)
    assert sorted(train) == sorted(again[0]) and sorted(heldout) == sorted(again[1])
    assert train and heldout and not set(train) & set(heldout)
    assert set(train) | set(heldout) == set(files)
    # Growing the fraction only moves files into held-out: a file's fate depends on its own path.
    train_more, heldout_more = corpus.split_files(files, 0.5, tiny_corpus)
    assert set(heldout) <= set(heldout_more)


def test_heldout_prompts_are_deterministic_and_from_heldout_files(tiny_corpus):
    prompts = corpus.heldout_prompts(5, prompt_chars=120, seed=3, heldout_fraction=0.25, root=tiny_corpus)
    assert prompts == corpus.heldout_prompts(5, prompt_chars=120, seed=3, heldout_fraction=0.25, root=tiny_corpus)
    _, heldout = corpus.split_files(corpus.stdlib_files(tiny_corpus), 0.25, tiny_corpus)
    heldout_text = "".join(corpus.read_text(p) for p in heldout)
    for prompt in prompts:
        assert prompt.lstrip().startswith(("def ", "class ")) and prompt in heldout_text


def test_forward_losses_matches_the_model_own_loss():
    """The hand-run layer stack (used for the early-exit loss) is the model's own forward."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config).eval()
    input_ids = torch.randint(0, 64, (2, 17))  # [batch, seq_len + 1]
    full, exit_loss = base.forward_losses(model, input_ids, exit_layer=1)
    torch.testing.assert_close(full, model(input_ids, labels=input_ids).loss)
    # The exit loss equals running a copy truncated to the first layer through the same norm and head.
    truncated = LlamaForCausalLM(LlamaConfig(**{**config.to_dict(), "num_hidden_layers": 1})).eval()
    truncated.load_state_dict(model.state_dict(), strict=False)
    torch.testing.assert_close(exit_loss, truncated(input_ids, labels=input_ids).loss)


def test_tiny_run_saves_a_loadable_model_that_generates(tiny_corpus, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    settings = _tiny_settings(tmp_path / "model", tiny_corpus)
    log = base.train(settings, progress_bar=False)
    out = Path(settings.out)
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "training_log.json"):
        assert (out / name).exists(), name
    saved_log = json.loads((out / "training_log.json").read_text())
    assert saved_log["steps"] == 6 and saved_log["torch_threads"] == torch.get_num_threads()
    assert saved_log["heldout_loss"] == log["heldout_loss"] and saved_log["tokens_seen"] == 6 * 4 * 32
    assert machine_paths(saved_log) == [] and saved_log["settings"]["out"] == "model"  # it ships beside the model

    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert tokenizer.eos_token == corpus.EOS_TOKEN
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.config.tie_word_embeddings
    prompt = tokenizer("def function_1_2(value", return_tensors="pt")
    generated = model.generate(**prompt, max_new_tokens=5, do_sample=False, min_new_tokens=5)
    assert generated.shape[1] == prompt["input_ids"].shape[1] + 5
    assert tokenizer.decode(prompt["input_ids"][0]) == "def function_1_2(value"

    # Same seed, same step budget: the same held-out loss (the run is deterministic without a time budget).
    again = base.train(_tiny_settings(tmp_path / "again", tiny_corpus), progress_bar=False)
    assert again["heldout_loss"] == log["heldout_loss"]


def test_early_exit_run_logs_exit_and_full_heldout_loss(tiny_corpus, tmp_path):
    settings = _tiny_settings(
        tmp_path / "exit", tiny_corpus, early_exit_loss=1, early_exit_weight=0.5, layer_dropout=0.3,
        save_dtype="float16",
    )
    log = base.train(settings, progress_bar=False)
    assert "heldout_loss" in log and "heldout_loss_exit_layer_1" in log
    assert all("heldout_loss_exit_layer_1" in evaluation for evaluation in log["evaluations"])
    from safetensors import safe_open

    with safe_open(str(Path(settings.out) / "model.safetensors"), "pt") as weights:
        assert all(weights.get_tensor(k).dtype == torch.float16 for k in weights.keys())


def test_reusing_a_tokenizer_and_flags_map_to_fields(tiny_corpus, tmp_path):
    first = _tiny_settings(tmp_path / "first", tiny_corpus, max_steps=1)
    base.train(first, progress_bar=False)
    settings = base.parse_args([
        "--out", str(tmp_path / "draft"), "--tokenizer", first.out, "--corpus-root", str(tiny_corpus),
        "--hidden-size", "16", "--num-layers", "1", "--num-heads", "1", "--num-kv-heads", "1",
        "--intermediate-size", "32", "--vocab-size", "512", "--seq-len", "16", "--batch-size", "2",
        "--time-budget", "0", "--max-steps", "2", "--heldout-fraction", "0.25", "--eval-tokens", "64",
    ])
    assert settings.hidden_size == 16 and settings.tokenizer == first.out and settings.seed == 0
    base.train(settings, progress_bar=False)
    draft_vocab = json.loads((Path(settings.out) / "tokenizer.json").read_text())["model"]["vocab"]
    first_vocab = json.loads((Path(first.out) / "tokenizer.json").read_text())["model"]["vocab"]
    assert draft_vocab == first_vocab


def test_settings_reject_a_run_that_never_stops(tmp_path):
    with pytest.raises(ValueError):
        base.BaseSettings(out=str(tmp_path), time_budget=0, max_steps=0)
    with pytest.raises(ValueError):
        base.BaseSettings(out=str(tmp_path), early_exit_loss=6)
