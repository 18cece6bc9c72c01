"""selfspec.bench: settings from flags, the report's arithmetic on scripted runs, the shipped prompts, and a short
end-to-end run on a tiny model directory (tables and JSON written, greedy tokens identical to generate's). No
wall-clock assertions: timings on a shared CPU are noise; the paths and the arithmetic are what is tested."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from selfspec import bench
from selfspec.bench.methods import GREEDY, SAMPLE, Method, Run, steps_from_calls
from selfspec.bench.plot import plot_sweep
from selfspec.bench.prompts import CHAT_PROMPTS, code_prompts, prompt_ids, prompt_texts
from selfspec.bench.schedule import Entry
from selfspec.bench.settings import EXAMPLES, REFERENCE, default_out, model_name, parse_args
from selfspec.bench.summary import summarize
from tests.selfspec.tiny_text import save_model_dir, tiny_text_model, tiny_tokenizer

SELFSPEC = Path(bench.__file__).resolve().parents[1]


# -- settings ---------------------------------------------------------------------------------------------------


def test_defaults_resolve_from_the_repository_not_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = parse_args([])
    assert Path(settings.model) == REFERENCE / "model" and Path(settings.model).is_absolute()
    assert Path(settings.out) == EXAMPLES / "reference" / "bench"
    assert settings.threads == 1 and settings.fixed_k == 0 and settings.time_limit is None and not settings.t1
    shipped = REFERENCE / "heads" / "config.json"
    assert settings.heads == (str(REFERENCE / "heads") if shipped.is_file() else None)


def test_quick_sets_a_small_run_and_explicit_flags_win():
    settings = parse_args(["--quick", "--repeats", "5", "--time-limit", "2.5", "--t1", "--heads", "none",
                           "--model", "smollm2", "--exit-layer", "8"])
    assert (settings.max_new_tokens, settings.num_prompts, settings.repeats) == (32, 2, 5)
    assert settings.time_limit == 2.5 and settings.t1 and settings.heads is None and settings.exit_layer == 8
    assert Path(settings.out) == EXAMPLES / "smollm2" / "bench"


@pytest.mark.parametrize("model, name", [
    ("smollm2", "smollm2"),
    (str(EXAMPLES / "reference" / "model"), "reference"),
    ("/somewhere/SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q4_1"),
    ("/runs/my-model", "my-model"),
])
def test_model_name_names_the_output_directory(model, name):
    assert model_name(model) == name and default_out(model) == EXAMPLES / name / "bench"


def test_a_bad_flag_exits_with_argparse_status():
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--repeats", "many"])
    assert exit_info.value.code == 2


# -- the report's arithmetic --------------------------------------------------------------------------------------


def _method(name: str, drafter: str = "none") -> Method:
    return Method(name, "selfspec", run=None, drafter=drafter)


def _entry(method, mode, round_, prompt, tokens, seconds, forwards, ids=(1, 2, 3), drafted=(), accepted=()):
    return Entry(method, mode, round_, prompt, Run(tokens, seconds, list(ids), forwards, list(drafted), list(accepted)))


def test_summary_medians_ratios_identity_and_acceptance_on_scripted_runs():
    plain, off, fast = _method("generate"), _method("off"), _method("fast", "ngram")
    entries = []
    # Three rounds of two prompts, 10 tokens each: generate takes 1 s a prompt; `fast` takes 0.5, 0.25 and 1.0 s
    # (per-round speedups 2, 4, 1: median 2); `off` always 0.8 s (1.25x).
    for round_, fast_seconds in enumerate((0.5, 0.25, 1.0)):
        for p in range(2):
            entries.append(_entry(plain, GREEDY, round_, p, 10, 1.0, 10))
            entries.append(_entry(off, GREEDY, round_, p, 10, 0.8, 10))
            # prompt 1 of round 2 gives different tokens: 5 of 6 greedy runs identical
            ids = (9, 9, 9) if (round_, p) == (2, 1) else (1, 2, 3)
            # each run: 5 forwards, drafts at positions 0, 1, 2 proposed 4, 4, 2 times and accepted 4, 2, 0 times
            entries.append(_entry(fast, GREEDY, round_, p, 10, fast_seconds, 5, ids, (4, 4, 2), (4, 2, 0)))
    records = summarize(entries, ["generate", "off", "fast"], {"speedup": "generate", "vs_off": "off"}, 1000)
    by_name = {r["method"]: r for r in records}
    assert [r["method"] for r in records] == ["generate", "off", "fast"]
    assert by_name["generate"]["speedup"] == 1.0 and by_name["generate"]["greedy_identical"] is None
    fast_record = by_name["fast"]
    assert fast_record["speedup"] == pytest.approx(2.0) and fast_record["speedup_range"] == pytest.approx([1.0, 4.0])
    assert fast_record["vs_off"] == pytest.approx(2.0 * 0.8)
    assert by_name["off"]["speedup"] == pytest.approx(1.25)
    assert fast_record["tokens_per_second"] == pytest.approx(20.0)  # rounds: 20, 40, 10 tokens/s
    assert fast_record["tokens_per_forward"] == pytest.approx(2.0)
    assert fast_record["greedy_identical"] == [5, 6] and by_name["off"]["greedy_identical"] == [6, 6]
    assert fast_record["acceptance_by_position"] == pytest.approx([1.0, 0.5, 0.0])
    assert fast_record["acceptance"] == pytest.approx(6 / 10)
    assert fast_record["drafted_by_position"] == [24, 24, 12] and fast_record["runs"] == 6


def test_summary_keeps_modes_apart_and_skips_identity_when_sampling():
    plain, fast = _method("generate"), _method("fast", "ngram")
    entries = [_entry(plain, SAMPLE, 0, 0, 8, 1.0, 8), _entry(fast, SAMPLE, 0, 0, 8, 2.0, 4, ids=(5,)),
               _entry(plain, GREEDY, 0, 0, 8, 1.0, 8), _entry(fast, GREEDY, 0, 0, 8, 0.5, 4)]
    records = summarize(entries, ["generate", "fast"], {"speedup": "generate"}, 1000)
    assert [(r["mode"], r["method"]) for r in records] == [
        (SAMPLE.name, "generate"), (SAMPLE.name, "fast"), (GREEDY.name, "generate"), (GREEDY.name, "fast")]
    assert records[1]["speedup"] == pytest.approx(0.5) and records[1]["greedy_identical"] is None
    assert records[3]["speedup"] == pytest.approx(2.0) and records[3]["greedy_identical"] == [1, 1]


@pytest.mark.parametrize("calls, prompt_len, final_len, steps", [
    ([(0, 5), (5, 1), (6, 1)], 5, 8, [(0, 0), (0, 0), (0, 0)]),  # plain decoding: prefill, then one token a forward
    ([(0, 8), (7, 4), (9, 1)], 5, 11, [(3, 2), (3, 1), (0, 0)]),  # drafts with the prefill, then 3, then none
    ([(0, 5), (4, 2)], 5, 8, None),  # a cache that shrank: not the pattern, so no per-position figures
])
def test_steps_from_calls(calls, prompt_len, final_len, steps):
    assert steps_from_calls(calls, prompt_len, final_len) == steps


def test_no_plot_without_matplotlib(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else find_spec(name, *a))
    record = {"drafter": "ngram", "num_draft_tokens": 1, "speedup": 1.0, "speedup_range": [1.0, 1.0],
              "tokens_per_forward": 1.0}
    assert plot_sweep([record], tmp_path / "sweep.png") is False and not (tmp_path / "sweep.png").exists()


# -- prompts ------------------------------------------------------------------------------------------------------


def test_shipped_prompts_chat_through_the_template_code_as_text():
    assert len(CHAT_PROMPTS) == 16 and len(set(CHAT_PROMPTS)) == 16
    code = code_prompts()
    assert len(code) == 16 and all(re.match(r"\s*(def|class) ", p) for p in code)
    chat_tokenizer, code_tokenizer = tiny_tokenizer(chat_template=True), tiny_tokenizer(chat_template=False)
    kind, texts = prompt_texts(chat_tokenizer, 2)
    assert kind == "chat" and texts == list(CHAT_PROMPTS[:2])
    [ids] = prompt_ids(chat_tokenizer, texts[:1], kind, None, 8, "cpu")
    expected = chat_tokenizer.apply_chat_template([{"role": "user", "content": texts[0]}], add_generation_prompt=True,
                                                  tokenize=True, return_dict=False)
    assert ids[0].tolist() == list(expected) and ids.shape[0] == 1
    assert chat_tokenizer.decode(ids[0]).endswith("<|assistant|>")
    kind, texts = prompt_texts(code_tokenizer, 3)
    assert kind == "code" and texts == list(code[:3])
    [ids] = prompt_ids(code_tokenizer, texts[:1], kind, 40, 8, "cpu")
    assert ids.shape[1] == 40 - 8 - 1  # cut from the left to leave room for the new tokens
    with pytest.raises(SystemExit):
        prompt_texts(code_tokenizer, 17)


def test_the_library_never_imports_training():
    pattern = re.compile(r"^\s*(from|import)\s+training\b", re.MULTILINE)
    offenders = [str(p) for p in SELFSPEC.rglob("*.py") if pattern.search(p.read_text())]
    assert offenders == []


# -- end to end ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny float64 chat model directory (float64: no rounding near-ties, so greedy identity is exact) and heads."""
    from heads import MedusaHeads

    root = tmp_path_factory.mktemp("tiny")
    save_model_dir(root / "model", seed=0, dtype=torch.float64)
    MedusaHeads.for_model(tiny_text_model(seed=0), num_heads=2).save_pretrained(root / "heads")
    return root


def test_bench_runs_end_to_end_and_writes_json_and_markdown(tiny, tmp_path):
    out = tmp_path / "bench"
    report = bench.main([
        "--model", str(tiny / "model"), "--heads", str(tiny / "heads"), "--eagle", str(tmp_path / "no-eagle"),
        "--dtype", "float64", "--num-prompts", "1", "--max-new-tokens", "6", "--repeats", "2", "--fixed-k", "2",
        "--t1", "--sweep-max", "2", "--sweep-prompts", "1", "--useless-prompts", "1", "--out", str(out),
    ])
    saved = json.loads((out / "results.json").read_text())
    assert saved["phases_finished"] == ["main", "sweep", "useless drafts"] and not saved["stopped_by_time_limit"]
    assert saved["prompt_kind"] == "chat" and saved["prompts"] == [CHAT_PROMPTS[0]]
    assert saved["machine"]["torch_threads"] == 1
    records = saved["records"]
    assert {r["mode"] for r in records} == {"greedy", "sample t=0.7 top-p=0.9", "sample t=1.0"}
    methods = list(dict.fromkeys(r["method"] for r in records))
    assert methods == [
        "generate", "transformers prompt lookup k=3", "transformers early exit L=1", "selfspec speculation off",
        "selfspec ngram (default)", "selfspec ngram k=2", "selfspec early_exit L=1 (default)",
        "selfspec early_exit L=1 k=2", "selfspec medusa (default)", "selfspec medusa k=2",
    ]
    assert len(records) == 3 * len(methods)
    for r in records:
        assert r["rounds"] == 2 and r["runs"] == 2 and r["tokens_per_forward"] >= 1.0 and r["speedup"] > 0
        assert all(0.0 <= a <= 1.0 for a in r["acceptance_by_position"])
        if r["mode"] == "greedy" and r["method"] != "generate":  # exactness shows in the benchmark too
            assert r["greedy_identical"] == [2, 2], r["method"]
    greedy = {r["method"]: r for r in records if r["mode"] == "greedy"}
    assert greedy["generate"]["speedup"] == 1.0 and greedy["selfspec speculation off"]["tokens_per_forward"] == 1.0
    assert greedy["selfspec medusa (default)"]["extra_parameters"] > 0
    assert greedy["selfspec ngram k=2"]["num_draft_tokens"] == 2
    assert greedy["selfspec ngram (default)"]["num_draft_tokens"] == "default"
    assert any("eagle skipped" in n for n in saved["notes"])
    assert {(r["drafter"], r["num_draft_tokens"]) for r in saved["sweep"]} == {
        ("none", "default"), ("ngram", 1), ("ngram", 2), ("early_exit", 1), ("early_exit", 2), ("medusa", 1),
        ("medusa", 2)}
    useless = saved["useless_drafts"]
    assert {r["case"] for r in useless} == {
        "random drafts", "random (untrained) Medusa heads", "random (untrained) EAGLE head", "weak heads at T=1",
        "early exit at untrained layer 1", "fresh SelfSpecModel per call"}
    for r in useless:
        assert r["speedup"] > 0 and r["vs_speculation_off"] > 0
        assert r["mode"] == ("sample t=1.0" if r["case"] == "weak heads at T=1" else r["mode"])
    random_drafts = [r for r in useless if r["case"] == "random drafts"]
    assert {r["mode"] for r in random_drafts} == {"greedy", "sample t=0.7 top-p=0.9"}
    table = (out / "results.md").read_text()
    assert "| method | tokens/s | speedup | tokens/forward | acceptance by position |" in table
    assert "### sweep" in table and "### useless drafts" in table and "| fresh SelfSpecModel per call |" in table
    assert (out / "sweep.png").exists() == (importlib.util.find_spec("matplotlib") is not None)
    assert report["records"] == records


def test_time_limit_stops_cleanly_and_keeps_the_outputs(tiny, tmp_path):
    out = tmp_path / "bench"
    report = bench.main(["--model", str(tiny / "model"), "--heads", "none", "--dtype", "float64", "--num-prompts", "1",
                         "--max-new-tokens", "4", "--time-limit", "0", "--out", str(out)])
    saved = json.loads((out / "results.json").read_text())
    assert report["stopped_by_time_limit"] and saved["stopped_by_time_limit"]
    assert saved["phases_finished"] == [] and saved["records"] == [] and saved["useless_drafts"] == []
    assert "stopped by --time-limit" in (out / "results.md").read_text()


def test_code_model_without_chat_template_gets_code_prompts(tmp_path):
    model = save_model_dir(tmp_path / "model", dtype=torch.float64, chat_template=False)
    report = bench.main(["--model", model, "--heads", "none", "--dtype", "float64", "--num-prompts", "1",
                         "--max-new-tokens", "4", "--repeats", "1", "--sweep-max", "0", "--time-limit", "600",
                         "--out", str(tmp_path / "out")])
    assert report["prompt_kind"] == "code" and report["prompts"] == [code_prompts()[0].splitlines()[0]]
    assert report["phases_finished"] == ["main", "sweep", "useless drafts"] and report["sweep"] == []


@pytest.mark.parametrize("missing", ["model", "heads"])
def test_a_missing_directory_fails_in_one_line(tiny, tmp_path, missing):
    paths = {"model": str(tiny / "model"), "heads": str(tiny / "heads"), missing: str(tmp_path / "absent")}
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--model", paths["model"], "--heads", paths["heads"]])
    message = str(exit_info.value)
    assert "\n" not in message and paths[missing] in message


@pytest.mark.parametrize("flag, expected", [(None, None), ("4", 4), ("auto", "auto"), ("off", None)])
def test_tree_size_flag(flag, expected):
    from selfspec.bench.settings import tree_size

    assert tree_size(parse_args([] if flag is None else ["--tree-size", flag])) == expected


def test_a_bad_tree_size_exits_with_argparse_status():
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--tree-size", "big"])
    assert exit_info.value.code == 2


def _loaded_with_heads(dtype=torch.float64):
    from heads import MedusaHeads
    from heads.eagle import EagleHead
    from selfspec.bench.models import Loaded

    model = tiny_text_model(seed=0, dtype=dtype)
    return Loaded(model, None, MedusaHeads.for_model(model, num_heads=2), None, EagleHead.for_model(model).eval(),
                  None, 1, 1, None, None)


def test_tree_rows_sit_beside_the_default_rows():
    """Without the few-row kernel (float64) "auto" drafts chains: the default rows are chains, --tree-size adds tree
    rows beside them and --chains adds nothing (no default is a tree)."""
    from selfspec.bench.run import main_methods

    methods, specs = main_methods(parse_args(["--tree-size", "6", "--chains", "--fixed-k", "2"]), _loaded_with_heads(),
                                  [])
    names = [m.name for m in methods]
    medusa = names.index("selfspec medusa (default)")
    assert names[medusa: medusa + 4] == [
        "selfspec medusa (default)", "selfspec medusa k=2", "selfspec medusa tree=6", "selfspec medusa tree=6 k=2",
    ]
    assert next(m for m in methods if m.name == "selfspec medusa tree=6 k=2").spec.tree_size == 6
    assert not any(" chain" in name for name in names)
    assert all(spec.tree_size == 0 for spec in specs.values())  # the sweep stays with chains
    assert names.index("selfspec eagle tree=6") == names.index("selfspec eagle k=2") + 1


@pytest.mark.usefixtures("needs_kernel")
def test_where_the_default_is_a_tree_chains_adds_chain_rows_and_the_sweep_keeps_chains():
    """With the few-row kernel (float32 on this CPU) EAGLE's default row is a tree of 10; --chains puts a chain row
    beside it; the sweep gets chain wrappers; --kernel-off's row is the default with the kernel off, which "auto"
    verifies as chains. Medusa's default is a chain (no chain row beside it)."""
    from selfspec.bench.run import main_methods

    methods, specs = main_methods(parse_args(["--chains", "--kernel-off", "--draft-float32"]),
                                  _loaded_with_heads(torch.float32), [])
    by_name = {m.name: m for m in methods}
    assert by_name["selfspec eagle tree=10 (default)"].spec.tree_size == 10
    assert by_name["selfspec eagle tree=10 (default)"].spec.draft_dtype is torch.bfloat16
    float32_drafter = by_name["selfspec eagle tree=10 float32 drafter"].spec  # the default's shape, float32 weights
    assert float32_drafter.tree_size == 10 and float32_drafter.draft_dtype is None
    assert by_name["selfspec medusa float32 drafter"].spec.draft_dtype is None
    assert by_name["selfspec eagle chain"].spec.tree_size == 0
    assert by_name["selfspec eagle kernel off"].spec.tree_size == 0
    assert by_name["selfspec medusa (default)"].spec.tree_size == 0 and "selfspec medusa chain" not in by_name
    assert all(spec.tree_size == 0 for spec in specs.values())
    assert by_name["selfspec ngram (default)"].spec.tree_size == 0
    notes = []
    names = [m.name for m in main_methods(parse_args(["--tree-size", "auto"]), _loaded_with_heads(torch.float32),
                                          notes)[0]]
    assert not any("tree=" in name and "(default)" not in name for name in names)  # eagle's is the default row
    assert any("medusa --tree-size auto: no tree row" in note for note in notes)


def test_skip_leaves_out_named_rows_but_never_the_baselines():
    """Planted bug caught: filtering without the baseline exemption dropped "generate" for --skip generate."""
    from selfspec.bench.models import Loaded
    from selfspec.bench.run import GENERATE, OFF, main_methods

    model = tiny_text_model(seed=0)
    loaded = Loaded(model, None, None, None, None, None, 1, 1, None, None)
    notes = []
    methods, _ = main_methods(parse_args(["--skip", "transformers early exit, ngram,generate"]), loaded, notes)
    names = [m.name for m in methods]
    assert GENERATE in names and OFF in names
    assert not any("transformers early exit" in n or "ngram" in n for n in names)
    assert "selfspec early_exit L=1 (default)" in names and any("prompt lookup" in n for n in names)
    assert any("left out with --skip" in note and "ngram" in note for note in notes)
    all_names = [m.name for m in main_methods(parse_args([]), loaded, [])[0]]
    assert len(all_names) == len(names) + 2


def _useless_drafts_recorded(monkeypatch, settings, loaded, prompts):
    """(records, stopped, the entries of each schedule it ran) of the benchmark's useless-drafts check."""
    from selfspec.bench import run as bench_run
    from selfspec.bench.schedule import Deadline, run_schedule

    schedules = []

    def recorded(*args, **kwargs):
        finished, stopped = run_schedule(*args, **kwargs)
        schedules.append(finished)
        return finished, stopped

    monkeypatch.setattr(bench_run, "run_schedule", recorded)
    records, stopped = bench_run.useless_drafts(settings, loaded, prompts, Deadline(None), [])
    return records, stopped, schedules


def test_useless_drafts_runs_decode_exactly_max_new_tokens_even_past_eos(monkeypatch):
    """Sampled methods draw different tokens, so with an EOS stop their runs end at different lengths and a short
    run's tokens/s carries more prefill: the useless-drafts check compares equal work. Here EOS is the token the
    model emits first, so any method that stopped at it would return 1 token. Catches (planted): the baselines or
    the cases built with the tokenizer's EOS."""
    from selfspec.bench.models import Loaded
    from selfspec.bench.settings import BenchSettings

    model, n = tiny_text_model(seed=0, dtype=torch.float64), 5
    prompt = torch.tensor([[5, 6, 7, 8]])
    first = int(model.generate(prompt, max_new_tokens=1, do_sample=False, pad_token_id=0)[0, -1])
    loaded = Loaded(model, tiny_tokenizer(), None, None, None, None, 1, 1, None, first)
    settings = BenchSettings(max_new_tokens=n, useless_prompts=1, repeats=1, seed=0)
    records, stopped, schedules = _useless_drafts_recorded(monkeypatch, settings, loaded, [prompt])
    entries = [e for schedule in schedules for e in schedule]
    assert not stopped and {r["case"] for r in records} >= {"random drafts", "fresh SelfSpecModel per call"}
    assert {e.method.name for e in entries} >= {"generate", "selfspec speculation off"}
    for e in entries:  # the baselines' runs as well as the cases'
        assert e.run.new_tokens == n, (e.method.name, e.mode.name)
    assert all(r["speedup"] > 0 and r["vs_speculation_off"] > 0 for r in records)


def test_useless_cases_share_one_schedule_and_its_baselines(monkeypatch):
    """Every case runs in one schedule, so each (round, prompt, mode) block runs generate and speculation off once
    for all the cases of that mode (each case in its own schedule spent two thirds of the check on baselines); the
    rows still pair each case with the baselines' runs of its own blocks. Catches (planted): a schedule per case (5
    here, the baselines run once per case). A case run in modes it does not name (`modes_of` ignored: weak heads in
    greedy) is caught by test_bench_runs_end_to_end_and_writes_json_and_markdown."""
    from selfspec.bench.models import Loaded
    from selfspec.bench.settings import BenchSettings

    model = tiny_text_model(seed=0, dtype=torch.float64)
    loaded = Loaded(model, tiny_tokenizer(), None, None, None, None, 1, 1, None, None)
    settings = BenchSettings(max_new_tokens=3, useless_prompts=2, repeats=2, seed=0)
    prompts = [torch.tensor([[5, 6, 7, 8]]), torch.tensor([[9, 10, 11]])]
    records, stopped, schedules = _useless_drafts_recorded(monkeypatch, settings, loaded, prompts)
    assert not stopped and len(schedules) == 1
    cases = {r["method"] for r in records}
    assert len(cases) >= 4 and {r["case"] for r in records} >= {"random drafts", "fresh SelfSpecModel per call"}
    blocks = {}
    for e in schedules[0]:
        blocks.setdefault((e.round, e.prompt, e.mode.name), []).append(e.method.name)
    assert len(blocks) == 2 * 2 * 2  # rounds x prompts x modes (greedy, sampled)
    for names in blocks.values():
        assert sorted(names) == sorted(["generate", "selfspec speculation off", *cases])
    assert all(r["rounds"] == 2 and r["runs"] == 4 for r in records)


def test_useless_prompts_zero_leaves_the_check_out(monkeypatch):
    from selfspec.bench import run as bench_run
    from selfspec.bench.schedule import Deadline
    from selfspec.bench.settings import BenchSettings

    monkeypatch.setattr(bench_run, "useless_cases", lambda *args, **kwargs: pytest.fail("no case should be built"))
    assert bench_run.useless_drafts(BenchSettings(useless_prompts=0), None, [], Deadline(None), []) == ([], False)
