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


def test_heads_resolve_from_the_repository_outputs_go_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = parse_args([])
    assert Path(settings.model) == REFERENCE / "model" and Path(settings.model).is_absolute()
    assert Path(settings.out) == tmp_path / "bench-results" / "reference"  # never inside the package
    assert (settings.max_new_tokens, settings.threads, settings.fixed_k, settings.time_limit) == (128, 1, 0, None)
    assert settings.sweep_max == 0 and settings.useless_prompts == 0  # one table by default
    assert not (settings.llama_cpp or settings.transformers_assisted or settings.chains or settings.kernel_off)
    shipped = REFERENCE / "heads" / "config.json"
    assert settings.heads == (str(REFERENCE / "heads") if shipped.is_file() else None)


def test_smollm2_defaults_to_its_shipped_heads_each_only_when_it_exists(tmp_path, monkeypatch):
    """Catches (planted): eagle3 picked up without its config.json (a half-written training output)."""
    from selfspec.bench import settings as bench_settings

    monkeypatch.setattr(bench_settings, "EXAMPLES", tmp_path)
    for kind in ("heads", "eagle"):
        (tmp_path / "smollm2" / kind).mkdir(parents=True)
        (tmp_path / "smollm2" / kind / "config.json").write_text("{}")
    (tmp_path / "smollm2" / "eagle3").mkdir()  # no config.json: not a head yet
    settings = parse_args(["--model", "smollm2"])
    assert settings.heads == str(tmp_path / "smollm2" / "heads")
    assert settings.eagle == str(tmp_path / "smollm2" / "eagle") and settings.eagle3 is None
    (tmp_path / "smollm2" / "eagle3" / "config.json").write_text("{}")
    assert parse_args(["--model", "smollm2"]).eagle3 == str(tmp_path / "smollm2" / "eagle3")
    assert parse_args(["--model", "smollm2", "--eagle", "none", "--heads", "none"]).eagle is None


def test_the_shipped_smollm2_heads_are_its_defaults():
    settings = parse_args(["--model", "smollm2"])
    assert settings.heads == str(EXAMPLES / "smollm2" / "heads") and settings.eagle == str(EXAMPLES / "smollm2" / "eagle")


def test_quick_sets_a_small_run_and_explicit_flags_win(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = parse_args(["--quick", "--repeats", "5", "--time-limit", "2.5", "--heads", "none",
                           "--model", "smollm2", "--exit-layer", "8"])
    assert (settings.max_new_tokens, settings.num_prompts, settings.repeats) == (32, 2, 5)
    assert settings.time_limit == 2.5 and settings.heads is None and settings.exit_layer == 8
    assert Path(settings.out) == tmp_path / "bench-results" / "smollm2"


@pytest.mark.parametrize("model, name", [
    ("smollm2", "smollm2"),
    (str(EXAMPLES / "reference" / "model"), "reference"),
    ("/somewhere/SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q4_1"),
    ("/runs/my-model", "my-model"),
])
def test_model_name_names_the_output_directory(model, name):
    assert model_name(model) == name and default_out(model) == Path.cwd() / "bench-results" / name


def test_every_flag_says_why_its_default_is_what_it_is():
    from dataclasses import fields

    from selfspec.bench.settings import HELP, BenchSettings

    assert sorted(HELP) == sorted(f.name for f in fields(BenchSettings))
    assert all(len(text) > 20 for text in HELP.values())


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
            # prompt 1 at round_ == 2 gives different tokens: 5 of 6 greedy runs identical
            ids = (9, 9, 9) if (round_, p) == (2, 1) else (1, 2, 3)
            # each run: 5 forwards, drafts at positions 0, 1, 2 proposed 4, 4, 2 times and accepted 4, 2, 0 times
            entries.append(_entry(fast, GREEDY, round_, p, 10, fast_seconds, 5, ids, (4, 4, 2), (4, 2, 0)))
    records = summarize(entries, ["generate", "off", "fast"], {"speedup": "generate", "vs_off": "off"}, 1000)
    by_name = {r["method"]: r for r in records}
    assert [r["method"] for r in records] == ["generate", "off", "fast"]
    assert by_name["generate"]["speedup"] == 1.0 and by_name["generate"]["identical"] is None
    fast_record = by_name["fast"]
    assert fast_record["speedup"] == pytest.approx(2.0) and fast_record["speedup_range"] == pytest.approx([1.0, 4.0])
    assert fast_record["vs_off"] == pytest.approx(2.0 * 0.8)
    assert by_name["off"]["speedup"] == pytest.approx(1.25)
    assert fast_record["tokens_per_second"] == pytest.approx(20.0)  # rounds: 20, 40, 10 tokens/s
    assert fast_record["tokens_per_forward"] == pytest.approx(2.0)
    assert fast_record["identical"] == [5, 6] and by_name["off"]["identical"] == [6, 6]
    assert fast_record["identical_to"] == "generate"
    assert fast_record["agreeing_tokens"] == [15, 18]  # the differing run agrees on none of its 3 tokens
    from selfspec.bench.report import _identical

    assert _identical(fast_record) == "5/6 (83% of tokens)" and _identical(by_name["off"]) == "6/6"
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
    assert records[1]["speedup"] == pytest.approx(0.5) and records[1]["identical"] is None
    assert records[3]["speedup"] == pytest.approx(2.0) and records[3]["identical"] == [1, 1]


def test_seeded_runs_are_counted_against_speculation_off_with_the_same_seed():
    """The seeded row of every method is compared, per (round, prompt), with speculation off's seeded run; generate
    never runs seeded (no speedup over it there), and greedy rows still compare with generate. Catches (planted):
    comparing seeded runs with generate's (nothing to compare: None), or across prompts (a match would be missed)."""
    from selfspec.bench.methods import SEEDED
    from selfspec.bench.run import BASELINES, GENERATE, IDENTICAL_TO, OFF

    plain, off, fast = _method(GENERATE), _method(OFF), _method("fast", "ngram")
    entries = []
    for round_ in range(2):
        for p in range(2):
            same = (p, p + 1)
            entries += [_entry(plain, GREEDY, round_, p, 2, 1.0, 2, same), _entry(off, GREEDY, round_, p, 2, 1.0, 2, same),
                        _entry(fast, GREEDY, round_, p, 2, 0.5, 1, same),
                        _entry(off, SEEDED, round_, p, 2, 1.0, 2, same),
                        # one seeded run of `fast` parts from speculation off's (round_ == 1, prompt 0)
                        _entry(fast, SEEDED, round_, p, 2, 0.8, 1, (7, 7) if (round_, p) == (1, 0) else same)]
    records = summarize(entries, [GENERATE, OFF, "fast"], BASELINES, 1000, IDENTICAL_TO)
    seeded = {r["method"]: r for r in records if r["mode"] == SEEDED.name}
    assert set(seeded) == {OFF, "fast"} and seeded["fast"]["seeded"]
    assert seeded["fast"]["identical"] == [3, 4] and seeded["fast"]["identical_to"] == OFF
    assert seeded[OFF]["identical"] is None
    assert seeded["fast"]["vs_speculation_off"] == pytest.approx(1.25) and seeded["fast"]["speedup"] is None
    greedy = {r["method"]: r for r in records if r["mode"] == GREEDY.name}
    assert greedy["fast"]["identical"] == [4, 4] and greedy["fast"]["identical_to"] == GENERATE


def test_keyed_rows_are_priced_against_unseeded_speculation_off_at_their_temperature():
    """Keyed sampling's speed shares its denominator with the unseeded rows' (speculation off without a seed), so
    rejection sampling and the keyed coupling compare directly. Catches (planted): the keyed rows priced against
    keyed speculation off (2.0x here, not 1.0x) or against another temperature's (None: no pairing)."""
    from selfspec.bench.methods import KEYED, KEYED_T1, SAMPLE_T1
    from selfspec.bench.run import ACROSS_MODES, BASELINES, IDENTICAL_TO, OFF

    off, fast = _method(OFF), _method("fast", "eagle")
    entries = []
    for round_ in range(2):
        entries += [_entry(off, SAMPLE, round_, 0, 10, 1.0, 10), _entry(fast, SAMPLE, round_, 0, 10, 0.5, 5),
                    _entry(off, KEYED, round_, 0, 10, 2.0, 10), _entry(fast, KEYED, round_, 0, 10, 1.0, 6),
                    _entry(off, SAMPLE_T1, round_, 0, 10, 4.0, 10), _entry(fast, KEYED_T1, round_, 0, 10, 2.0, 6)]
    records = summarize(entries, [OFF, "fast"], BASELINES, 1000, IDENTICAL_TO, ACROSS_MODES)
    by = {(r["mode"], r["method"]): r for r in records}
    assert by[(KEYED.name, "fast")]["vs_unseeded_off"] == pytest.approx(1.0)
    assert by[(KEYED.name, "fast")]["vs_speculation_off"] == pytest.approx(2.0)
    assert by[(KEYED.name, OFF)]["vs_unseeded_off"] == pytest.approx(0.5)  # the keyed path's own cost shows
    assert by[(KEYED_T1.name, "fast")]["vs_unseeded_off"] == pytest.approx(2.0)
    assert by[(SAMPLE.name, "fast")]["vs_unseeded_off"] is None and by[(KEYED.name, "fast")]["keyed"]
    assert by[(KEYED.name, "fast")]["identical"] == [2, 2] and by[(KEYED.name, "fast")]["identical_to"] == OFF


def test_main_modes_are_the_tables_three_and_flags_add_keyed_and_t1():
    from selfspec.bench.methods import KEYED, KEYED_T1, SAMPLE_T1, SEEDED
    from selfspec.bench.run import main_modes

    assert main_modes(parse_args([])) == (GREEDY, SAMPLE, SEEDED)
    assert main_modes(parse_args(["--unseeded-keyed"])) == (GREEDY, SAMPLE, KEYED, SEEDED)
    assert main_modes(parse_args(["--t1"])) == (GREEDY, SAMPLE, SEEDED, SAMPLE_T1)
    modes = main_modes(parse_args(["--t1", "--unseeded-keyed"]))
    assert modes == (GREEDY, SAMPLE, KEYED, SEEDED, SAMPLE_T1, KEYED_T1)
    assert (SAMPLE_T1.temperature, SAMPLE_T1.top_p) == (1.0, None) and KEYED_T1.keyed and not KEYED_T1.seeded
    assert len({mode.title for mode in modes}) == len(modes)  # one column group each


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

    from heads.eagle import EagleHead

    root = tmp_path_factory.mktemp("tiny")
    save_model_dir(root / "model", seed=0, dtype=torch.float64)
    MedusaHeads.for_model(tiny_text_model(seed=0), num_heads=2).save_pretrained(root / "heads")
    EagleHead.for_model(tiny_text_model(seed=0)).save_pretrained(root / "eagle")
    return root


TABLE_HEADER = (
    "| method | greedy: tokens/s | greedy: vs generate | greedy: vs speculation off | greedy: tokens/forward "
    "| greedy: identical to generate | sampled: vs generate | sampled: vs speculation off | sampled: tokens/forward "
    "| seeded: vs speculation off | seeded: tokens/forward | seeded: identical to speculation off |"
)


def test_default_run_is_one_table_of_every_drafter_in_three_modes(tiny, tmp_path):
    """The default command's table (here on a tiny float64 chat model with Medusa heads and an EAGLE head, where
    "auto" drafts chains: the EAGLE chain row would repeat the default and is left out with a note)."""
    from selfspec.bench.methods import GREEDY, SAMPLE, SEEDED

    out = tmp_path / "bench"
    argv = ["--model", str(tiny / "model"), "--heads", str(tiny / "heads"), "--eagle", str(tiny / "eagle"),
            "--dtype", "float64", "--num-prompts", "2", "--max-new-tokens", "6", "--repeats", "2", "--out", str(out)]
    report = bench.main(argv)
    saved = json.loads((out / "results.json").read_text())
    assert saved["command"] == "python -m selfspec.bench " + " ".join(argv)
    assert saved["phases_finished"] == ["main", "sweep", "useless drafts"] and saved["sweep"] == []
    assert saved["useless_drafts"] == [] and saved["prompt_kind"] == "chat"
    records = saved["records"]
    rows = ["generate", "selfspec speculation off", "selfspec ngram (default)",
            "selfspec early_exit L=1 untrained (default)", "selfspec medusa (default)", "selfspec eagle (default)"]
    assert list(dict.fromkeys(r["method"] for r in records)) == rows
    by_mode = {mode.name: {r["method"]: r for r in records if r["mode"] == mode.name} for mode in (GREEDY, SAMPLE, SEEDED)}
    assert list(by_mode[GREEDY.name]) == rows and list(by_mode[SAMPLE.name]) == rows
    assert list(by_mode[SEEDED.name]) == rows[1:]  # generate takes no seed=
    assert len(records) == 3 * len(rows) - 1
    for r in records:
        assert r["rounds"] == 2 and r["runs"] == 4 and r["tokens_per_forward"] >= 1.0
    for name, r in by_mode[GREEDY.name].items():
        assert r["speedup"] > 0 and r["vs_speculation_off"] > 0
        if name != "generate":  # exactness shows in the benchmark too
            assert r["identical"] == [4, 4] and r["identical_to"] == "generate", name
    for name, r in by_mode[SEEDED.name].items():
        assert r["speedup"] is None and r["vs_speculation_off"] > 0
        if name != "selfspec speculation off":
            assert r["identical"][1] == 4 and r["identical_to"] == "selfspec speculation off", name
    assert any("no eagle chain row" in note for note in saved["notes"])
    table = (out / "results.md").read_text()
    assert table.splitlines()[2] == "`" + saved["command"] + "`"  # the exact command above the table
    assert TABLE_HEADER in table and "prefill for every row" in table
    assert table.count("\n| ") == len(rows) + 1 and "### sweep" not in table and "### useless" not in table
    off_row = next(line for line in table.splitlines() if line.startswith("| selfspec speculation off |"))
    assert off_row.count("|") == TABLE_HEADER.count("|")
    generate_row = next(line for line in table.splitlines() if line.startswith("| generate |"))
    assert generate_row.endswith("|  |  |  |")  # never seeded: empty seeded cells
    assert (out / "speedup.png").exists() == (importlib.util.find_spec("matplotlib") is not None)
    assert report["records"] == records


def test_unseeded_keyed_and_t1_add_column_groups_beside_rejection_sampling(tiny, tmp_path):
    """--unseeded-keyed --t1: keyed rows (selfspec only) beside the unseeded ones at T=0.7 and at T=1, each priced
    against unseeded speculation off at its temperature; a drawn seed is shared by every method of a run, so keyed
    tokens equal speculation off's too."""
    out = tmp_path / "bench"
    saved = bench.main(["--model", str(tiny / "model"), "--heads", "none", "--eagle", "none", "--skip", "ngram", "--dtype", "float64", "--num-prompts", "1",
                        "--max-new-tokens", "6", "--repeats", "2", "--fixed-k", "2", "--unseeded-keyed", "--t1",
                        "--out", str(out)])
    modes = list(dict.fromkeys(r["mode"] for r in saved["records"]))
    assert modes == ["greedy", "sample t=0.7 top-p=0.9", "sample t=0.7 top-p=0.9 keyed",
                     "sample t=0.7 top-p=0.9 seeded", "sample t=1.0", "sample t=1.0 keyed"]
    keyed = [r for r in saved["records"] if r["keyed"]]
    early_exit = "selfspec early_exit L=1 untrained"
    assert {r["method"] for r in keyed} == {"selfspec speculation off", early_exit + " (default)", early_exit + " k=2"}
    assert all(r["vs_unseeded_off"] > 0 and r["tokens_per_forward"] >= 1.0 for r in keyed)
    fixed = [r for r in keyed if r["method"] == early_exit + " k=2"]
    assert all(sum(r["drafted_by_position"]) > 0 for r in fixed)  # the keyed path verified drafts
    assert all(r["identical"] == [2, 2] for r in keyed if r["method"] != "selfspec speculation off")
    text = (out / "results.md").read_text()
    assert "temperature 0.7, top-p 0.9 and temperature 1 without top-p, without a seed" in text
    header = text.split("| method |")[1].splitlines()[0]
    assert "keyed: vs speculation off (unseeded) | keyed: tokens/forward" in header
    assert "sampled T=1: vs generate" in header and header.endswith("keyed T=1: tokens/forward |")


def test_optional_phases_and_rows_run_end_to_end(tiny, tmp_path):
    out = tmp_path / "bench"
    report = bench.main([
        "--model", str(tiny / "model"), "--heads", str(tiny / "heads"), "--eagle", str(tmp_path / "no-eagle"),
        "--dtype", "float64", "--num-prompts", "1", "--max-new-tokens", "6", "--repeats", "2", "--fixed-k", "2",
        "--transformers-assisted", "--sweep-max", "2", "--sweep-prompts", "1", "--useless-prompts", "1",
        "--out", str(out),
    ])
    saved = json.loads((out / "results.json").read_text())
    assert saved["phases_finished"] == ["main", "sweep", "useless drafts"] and not saved["stopped_by_time_limit"]
    assert saved["prompt_kind"] == "chat" and saved["prompts"] == [CHAT_PROMPTS[0]]
    assert saved["machine"]["torch_threads"] == 1
    records = saved["records"]
    assert {r["mode"] for r in records} == {"greedy", "sample t=0.7 top-p=0.9", "sample t=0.7 top-p=0.9 seeded"}
    methods = list(dict.fromkeys(r["method"] for r in records))
    assert methods == [
        "generate", "transformers prompt lookup k=3", "transformers early exit L=1", "selfspec speculation off",
        "selfspec ngram (default)", "selfspec ngram k=2", "selfspec early_exit L=1 untrained (default)",
        "selfspec early_exit L=1 untrained k=2", "selfspec medusa (default)", "selfspec medusa k=2",
    ]
    assert len(records) == 3 * len(methods) - 3  # transformers' three rows are never seeded
    for r in records:
        assert r["rounds"] == 2 and r["runs"] == 2 and r["tokens_per_forward"] >= 1.0
        assert r["vs_speculation_off"] > 0 and (r["speedup"] is None) == r["seeded"]
        assert all(0.0 <= a <= 1.0 for a in r["acceptance_by_position"])
        if r["mode"] == "greedy" and r["method"] != "generate":  # exactness shows in the benchmark too
            assert r["identical"] == [2, 2], r["method"]
    fixed = [r for r in records if r["mode"] == "greedy" and r["num_draft_tokens"] == 2]
    drafted = [r for r in fixed if sum(r["drafted_by_position"]) > 0]  # identity checked with drafts in play
    assert len(fixed) == 3 and drafted
    assert any(r["acceptance"] > 0 for r in drafted) and any(r["acceptance"] < 1 for r in drafted)
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
    assert TABLE_HEADER in table
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

    methods, specs = main_methods(parse_args(["--chains", "--kernel-off"]), _loaded_with_heads(torch.float32), [])
    by_name = {m.name: m for m in methods}
    assert by_name["selfspec eagle tree=10 (default)"].spec.tree_size == 10
    assert by_name["selfspec eagle tree=10 (default)"].spec.draft_dtype is torch.bfloat16
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


@pytest.mark.usefixtures("needs_kernel")
def test_default_flags_give_the_readmes_rows_in_order():
    """No flags, a float32 model with Medusa heads and an EAGLE head (as SmolLM2 ships): the README's rows, EAGLE as
    its default tree and as a chain. Catches (planted): the chain row only behind --chains."""
    from selfspec.bench.run import main_methods

    methods, _ = main_methods(parse_args([]), _loaded_with_heads(torch.float32), [])
    assert [m.name for m in methods] == [
        "generate", "selfspec speculation off", "selfspec ngram (default)",
        "selfspec early_exit L=1 untrained (default)", "selfspec medusa (default)",
        "selfspec eagle tree=10 (default)", "selfspec eagle chain"]
    assert [m.family for m in methods] == ["transformers"] + ["selfspec"] * 6


def test_an_eagle3_directory_is_its_own_row_after_eagle_and_one_that_does_not_load_is_a_note(tmp_path):
    """examples/<model>/eagle3 (when it exists) is wrapped from its directory, the heads saying their drafter; a head
    this version cannot draft with leaves a note instead of stopping the run."""
    from dataclasses import replace

    from heads.eagle import EagleHead
    from selfspec.bench.run import main_methods

    loaded = _loaded_with_heads()
    EagleHead.for_model(loaded.model).save_pretrained(tmp_path / "eagle3")
    names = [m.name for m in main_methods(parse_args([]), replace(loaded, eagle3_dir=str(tmp_path / "eagle3")), [])[0]]
    assert names[-2:] == ["selfspec eagle (default)", "selfspec eagle3 (default)"]
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{}")
    notes = []
    names = [m.name for m in main_methods(parse_args([]), replace(loaded, eagle3_dir=str(tmp_path / "broken")),
                                          notes)[0]]
    assert not any("eagle3" in name for name in names) and any("selfspec eagle3 skipped" in n for n in notes)


def test_skip_leaves_out_named_rows_but_never_the_baselines():
    """Planted bug caught: filtering without the baseline exemption dropped "generate" for --skip generate."""
    from selfspec.bench.models import Loaded
    from selfspec.bench.run import GENERATE, OFF, main_methods

    model = tiny_text_model(seed=0)
    loaded = Loaded(model, None, None, None, None, None, 1, 1, None, None)
    notes = []
    methods, _ = main_methods(parse_args(["--skip", "transformers early exit, ngram,generate",
                                          "--transformers-assisted"]), loaded, notes)
    names = [m.name for m in methods]
    assert GENERATE in names and OFF in names
    assert not any("transformers early exit" in n or "ngram" in n for n in names)
    assert "selfspec early_exit L=1 untrained (default)" in names and any("prompt lookup" in n for n in names)
    assert any("left out with --skip" in note and "ngram" in note for note in notes)
    all_names = [m.name for m in main_methods(parse_args(["--transformers-assisted"]), loaded, [])[0]]
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


# -- llama.cpp ----------------------------------------------------------------------------------------------------


def test_llama_cpp_without_the_package_exits_with_the_install_command(tiny, monkeypatch):
    import sys

    from selfspec.bench.llama_cpp import INSTALL

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` raises ImportError
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--model", str(tiny / "model"), "--llama-cpp"])
    message = str(exit_info.value)
    assert "llama-cpp-python" in message and INSTALL in message and "\n" not in message


def test_llama_cpp_needs_a_gguf_model(tiny, monkeypatch):
    import sys
    import types

    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=object))
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--model", str(tiny / "model"), "--llama-cpp"])
    assert "GGUF" in str(exit_info.value) and str(tiny / "model") in str(exit_info.value)


class FakeLlama:
    """llama_cpp.Llama's calls the benchmark makes: generate yields a fixed stream of tokens."""

    instances = []

    def __init__(self, **kwargs):
        self.kwargs, self.calls, self.events = kwargs, [], []
        FakeLlama.instances.append(self)

    def set_seed(self, seed):
        self.events.append(("seed", seed))

    def reset(self):
        self.events.append(("reset",))

    def generate(self, tokens, **options):
        self.calls.append((list(tokens), options))
        yield from [11, 12, 13, 2, 14, 15, 16, 17]  # 2: EOS


def test_llama_cpp_row_feeds_the_same_ids_and_stops_like_the_others(tmp_path, monkeypatch):
    """Same token ids in; EOS or max_new_tokens ends a run; the context is reset before every run (prefill paid);
    greedy at temperature 0, sampling at T and top-p alone (llama.cpp's default top-k 40 and min-p 0.05 off)."""
    import sys
    import types

    from selfspec.bench.llama_cpp import llama_cpp_method
    from selfspec.bench.methods import SEEDED

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=FakeLlama))
    method = llama_cpp_method(str(gguf), 3, [2, 99], threads=1, seed=0)
    llama = FakeLlama.instances[-1]
    assert llama.kwargs["model_path"] == str(gguf) and llama.kwargs["n_threads"] == 1
    prompt = torch.tensor([[5, 6, 7]])
    run = method.run(prompt, GREEDY, 42)
    assert run.token_ids == [11, 12, 13] and run.new_tokens == run.target_forwards == 3  # max_new_tokens
    assert llama.calls[-1][0] == [5, 6, 7] and llama.calls[-1][1]["temp"] == 0.0
    assert llama.events[-2:] == [("seed", 42), ("reset",)]
    long = llama_cpp_method(str(gguf), 10, 2, threads=2)
    run = long.run(prompt, SAMPLE, 7)
    assert run.token_ids == [11, 12, 13, 2]  # stopped at EOS, which it keeps (as generate does)
    options = FakeLlama.instances[-1].calls[-1][1]
    assert (options["temp"], options["top_p"], options["top_k"], options["min_p"]) == (0.7, 0.9, 0, 0.0)
    assert options["repeat_penalty"] == 1.0
    with pytest.raises(ValueError, match="seed"):
        long.run(prompt, SEEDED, 7)


def test_seeded_mode_passes_the_runs_seed_and_unseeded_modes_pass_none(monkeypatch):
    """Catches (planted): the seeded mode run without seed= (its tokens would then follow the global generator)."""
    from selfspec.bench.methods import SEEDED, selfspec_method
    from selfspec.engine import SelfSpecModel

    spec = SelfSpecModel(tiny_text_model(seed=0, dtype=torch.float64), drafter="ngram")
    seen = []
    generate = spec.generate
    monkeypatch.setattr(spec, "generate", lambda *a, **kw: seen.append(kw.get("seed")) or generate(*a, **kw))
    method = selfspec_method("ngram", lambda: spec, 4, None, "ngram")
    prompt = torch.tensor([[5, 6, 7, 8]])
    runs = [method.run(prompt, mode, 123) for mode in (GREEDY, SAMPLE, SEEDED, SEEDED)]
    assert seen == [None, None, 123, 123] and runs[2].token_ids == runs[3].token_ids and runs[2].new_tokens == 4


def test_keyed_mode_draws_a_fresh_seed_per_call_the_same_for_every_method_on_a_run():
    """--unseeded-keyed: each call passes seed= drawn from the global generator seeded with the run's seed (a fresh
    seed per prompt and round, as a `seed=random` default would draw; every method of that run gets the same one).
    Catches (planted): the run's seed itself (that is the seeded mode), or no seed (rejection sampling)."""
    from selfspec.bench.methods import KEYED, selfspec_method
    from selfspec.engine import SelfSpecModel

    spec = SelfSpecModel(tiny_text_model(seed=0, dtype=torch.float64), drafter="ngram")
    seen = []
    generate = spec.generate
    spec.generate = lambda *a, **kw: seen.append(kw.get("seed")) or generate(*a, **kw)
    method = selfspec_method("ngram", lambda: spec, 4, None, "ngram")
    prompt = torch.tensor([[5, 6, 7, 8]])
    for run_seed in (123, 123, 124):
        method.run(prompt, KEYED, run_seed)
    assert None not in seen and seen[0] == seen[1] != seen[2] and 123 not in seen
    short = method.run(prompt, KEYED, 5, max_new_tokens=2)  # the warm-up's short runs
    assert short.new_tokens == 2


def test_generate_runs_transformers_own_model_of_a_quantized_gguf_file(needs_kernel, tmp_path, monkeypatch):
    """selfspec's rows decode the file's kept blocks (--quantized auto), generate the dequantized float32 model:
    "x over generate" compares with transformers as a user gets it. Planted bug caught: main_methods handing
    loaded.model to generate ran it through selfspec's kernel."""
    from selfspec.bench import models as bench_models
    from selfspec.bench import run as bench_run
    from selfspec.kernel.quantized import quantized_weights
    from tests.selfspec.exercised import scrambled_model
    from tests.selfspec.kernel.test_quantized import write_gguf

    # vocab_size covers tiny_tokenizer's 300 tokens
    model = scrambled_model("llama", dtype=torch.float32, hidden=64, num_layers=2, vocab_size=320)
    model.config.tie_word_embeddings = True
    path = tmp_path / "tiny.Q8_0.gguf"
    write_gguf(model, path, "Q8_0")
    monkeypatch.setattr(bench_models, "load_tokenizer", lambda _: tiny_tokenizer())
    flags = ["--model", str(path), "--heads", "none", "--eagle", "none", "--eagle3", "none"]
    notes = []
    loaded = bench_models.load(parse_args(flags), notes)
    assert quantized_weights(loaded.model) and not quantized_weights(loaded.transformers_model)
    assert any("kept quantized" in note for note in notes)
    given = {}
    original = bench_run.transformers_method

    def recorded(name, model, *args, **kwargs):
        given[name] = model
        return original(name, model, *args, **kwargs)

    monkeypatch.setattr(bench_run, "transformers_method", recorded)
    bench_run.main_methods(parse_args(flags), loaded, [])
    assert given[bench_run.GENERATE] is loaded.transformers_model
    plain = bench_models.load(parse_args(flags + ["--quantized", "dequantize"]), [])
    assert not quantized_weights(plain.model) and plain.transformers_model is plain.model
    with pytest.raises(SystemExit):
        parse_args(["--quantized", "bogus"])


def test_the_machine_record_names_the_cpus_instruction_sets_and_the_quantized_backend(monkeypatch):
    from selfspec.bench.machine import SIMD_FLAGS, machine_info

    monkeypatch.setenv("SELFSPEC_QUANTIZED_BACKEND", "int8")
    machine = machine_info("cpu", 1)
    assert machine["quantized_backend"] == "int8"
    assert set(machine["cpu_flags"]) <= set(SIMD_FLAGS)
    try:
        present = open("/proc/cpuinfo").read()
    except OSError:
        return
    if " avx2" in present:  # (every CPU the kernel builds for has it; the list reads what this one has)
        assert "avx2" in machine["cpu_flags"]


def test_the_step_breakdown_times_the_forward_its_products_and_the_lm_head(needs_kernel, tmp_path):
    from selfspec.bench.step_time import describe_breakdown, step_breakdown
    from selfspec.kernel.backends import use_backend
    from selfspec.loading import load_model
    from tests.selfspec.exercised import scrambled_model
    from tests.selfspec.kernel.test_quantized import write_gguf

    model = scrambled_model("llama", dtype=torch.float32, hidden=64, num_layers=2, vocab_size=256)
    write_gguf(model, tmp_path / "tiny.Q8_0.gguf", "Q8_0")
    kept = load_model(tmp_path / "tiny.Q8_0.gguf")
    use_backend(kept, "int8")
    breakdown = step_breakdown(kept)
    assert breakdown["plain_forward"] and breakdown["forward_ms"] > 0 and breakdown["lm_head_ms"] > 0
    assert 0 < breakdown["products_ms"]
    line = describe_breakdown(breakdown, 1000.0 / (breakdown["forward_ms"] + breakdown["lm_head_ms"] + 1.0))
    assert "plain Llama forward" in line and "1.0 ms of it elsewhere" in line
    faster = describe_breakdown(breakdown, 2000.0 / (breakdown["forward_ms"] + breakdown["lm_head_ms"]))
    assert "elsewhere" not in faster and "speed moved" in faster  # (no negative time left for the engine)
    assert step_breakdown(model)["products_ms"] == 0.0  # (float weights: no kernel products to time alone)
