"""The batched benchmark's pieces on a tiny model: settings, the four methods' outputs and the record's arithmetic
(the benchmark itself is run by hand: see selfspec/bench/batch.py's docstring)."""
import pytest

from selfspec import SelfSpecModel
from selfspec.bench import batch as bench
from selfspec.bench.settings import REFERENCE
from tests.conftest import random_prompt, repetitive_prompt, tiny_model


def test_settings_and_default_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = bench.parse_args(["--model", str(REFERENCE / "model"), "--batch-sizes", "1,4"])
    assert bench.batch_sizes(settings) == [1, 4] and settings.out == str(tmp_path / "bench-results" / "reference" / "batch")
    with pytest.raises(SystemExit):
        bench.parse_args(["--batch-sizes", "0,x"])
    assert bench.parse_args(["--exit-layer", "2"]).exit_layer == 2  # early exit's rows (an int, not "2")


def test_methods_agree_row_by_row_and_records_count_it():
    model = tiny_model("llama")
    spec = SelfSpecModel(model, drafter="ngram")
    prompts = [random_prompt(7, seed=1), repetitive_prompt(12, seed=2), random_prompt(3, seed=3)]
    settings = bench.BatchBenchSettings(max_new_tokens=10, num_draft_tokens="3")
    eos = int(model.generate(prompts[0], max_new_tokens=4, do_sample=False, pad_token_id=2)[0, -1])  # row 0 stops
    runs = {
        "batch": bench.selfspec_batch(spec, prompts, settings, eos),
        "no drafts": bench.selfspec_batch(spec, prompts, settings, eos, drafts=False),
        "hf": bench.transformers_batched(model, prompts, settings, eos, pad=2),
        "alone": bench.selfspec_one_by_one(spec, prompts, settings, eos),
    }
    assert runs["batch"].new_tokens == runs["alone"].new_tokens == runs["hf"].new_tokens == runs["no drafts"].new_tokens
    assert len(runs["batch"].new_tokens[0]) <= 4 and runs["batch"].new_tokens[0][-1] == eos
    record = bench.record(3, "selfspec batch", [runs["batch"]], [runs["alone"]], [runs["hf"]])
    assert (record["identical_rows"], record["rows"]) == (3, 3)
    assert record["row_latency_max"] <= runs["batch"].seconds
    report = {"settings": vars(settings) | {"heads": None}, "model_name": "tiny", "drafter": "NgramDrafter",
              "prompt_kind": "code", "records": [record],
              "machine": {"device_name": "cpu", "torch_threads": 1, "torch": "", "transformers": "", "date": ""}}
    assert "| 3 | selfspec batch |" in bench.markdown(report) and "--exit-layer" not in bench.markdown(report)
    assert "--exit-layer 2 " in bench.markdown(report | {"settings": report["settings"] | {"exit_layer": 2}})
