"""selfspec.bench on a tiny random model: it runs end to end, writes the records, table and plot; it fails in one
line when a directory is missing; transformers' drafts per step are recovered from forward calls."""
from __future__ import annotations

import json

import pytest
import torch

from selfspec import bench
from selfspec.bench_methods import _steps_from_calls
from tests.selfspec.tiny_text import save_model_dir, tiny_text_model

RECORD_KEYS = {
    "method", "family", "drafter", "num_draft_tokens", "mode", "tokens_per_second", "tokens_per_second_range",
    "speedup", "speedup_range", "tokens_per_forward", "efficiency", "acceptance_by_position", "extra_parameters",
    "extra_parameters_fraction", "memory_bytes", "kv_cache_bytes", "greedy_identical",
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A tiny stand-in for examples/reference: model + tokenizer, Medusa heads, a draft model."""
    from heads import MedusaHeads

    root = tmp_path_factory.mktemp("reference")
    save_model_dir(root / "model", seed=0)
    save_model_dir(root / "draft", seed=1)
    MedusaHeads.for_model(tiny_text_model(seed=0, dtype=torch.float32), num_heads=2).save_pretrained(root / "heads")
    return root


def test_bench_runs_and_writes_records_table_and_plot(reference, tmp_path):
    out = tmp_path / "bench"
    report = bench.main([
        "--model", str(reference / "model"), "--heads", str(reference / "heads"),
        "--draft-model", str(reference / "draft"), "--num-prompts", "1", "--prompt-chars", "80",
        "--max-new-tokens", "4", "--repeats", "1", "--sweep-max", "2", "--sweep-prompts", "1",
        "--useless-prompts", "1", "--json", f"{out}.json", "--plot", f"{out}.png", "--markdown", f"{out}.md",
    ])
    saved = json.loads(out.with_suffix(".json").read_text())
    assert saved["machine"]["torch_threads"] == 1 and saved["machine"]["torch"] == torch.__version__
    records = saved["records"]
    assert {r["mode"] for r in records} == {"greedy", "sample t=1.0", "sample t=0.7 top-p=0.9"}
    methods = {r["method"] for r in records}
    for expected in ("generate", "transformers prompt lookup k=3", "transformers early exit L=1",
                     "transformers draft model", "selfspec speculation off", "selfspec medusa k=3", "selfspec ngram k=3"):
        assert expected in methods
    assert len(records) == 3 * len(methods)  # one record per method and mode
    for r in records:
        assert RECORD_KEYS <= r.keys()
        assert r["tokens_per_second"] > 0 and r["tokens_per_forward"] >= 1.0
    greedy = {r["method"]: r for r in records if r["mode"] == "greedy"}
    assert greedy["generate"]["speedup"] == 1.0
    for r in greedy.values():  # exactness shows in the benchmark too: greedy tokens equal plain generate's
        assert r["greedy_identical"] is None or r["greedy_identical"][0] == r["greedy_identical"][1]
    assert greedy["selfspec medusa k=3"]["extra_parameters"] > 0
    assert greedy["transformers draft model"]["extra_parameters"] > 0
    assert {(r["drafter"], r["num_draft_tokens"]) for r in saved["sweep"]} >= {("medusa", 1), ("ngram", 2), ("none", 0)}
    cases = {r["case"] for r in saved["useless_drafts"]}
    assert cases == {"random drafts", "heads with random weights", "random-token prompts"}
    table = out.with_suffix(".md").read_text()
    assert "| method | tokens/s | speedup | tokens/forward | efficiency |" in table and "### sweep" in table
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert report["records"] == records
    assert all(len(curve) > 1 and curve[0] == 1.0 for curve in saved["verify_cost"].values())


@pytest.mark.parametrize("missing, command", [
    ("model", "python -m training.base"), ("heads", "python -m training.heads"), ("draft", "python -m training.base"),
])
def test_missing_directory_fails_in_one_line_naming_the_command(reference, tmp_path, missing, command):
    paths = {name: str(reference / name) for name in ("model", "heads", "draft")}
    paths[missing] = str(tmp_path / "absent")
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--model", paths["model"], "--heads", paths["heads"], "--draft-model", paths["draft"]])
    message = str(exit_info.value)
    assert "\n" not in message and command in message and paths[missing] in message


@pytest.mark.parametrize("calls, prompt_len, final_len, steps", [
    ([(0, 5), (5, 1), (6, 1)], 5, 8, [(0, 0), (0, 0), (0, 0)]),  # plain decoding: prefill, then one token a forward
    ([(0, 8), (7, 4), (9, 1)], 5, 11, [(3, 2), (3, 1), (0, 0)]),  # drafts with the prefill, then 3, then none
    ([(0, 5), (4, 2)], 5, 8, None),  # a cache that shrank: not the pattern, so no per-position figures
])
def test_steps_from_calls(calls, prompt_len, final_len, steps):
    assert _steps_from_calls(calls, prompt_len, final_len) == steps
