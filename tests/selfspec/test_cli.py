"""The `selfspec` command line: one real end-to-end run in a subprocess, the rest through `main` in-process (a
subprocess pays seconds to import torch); mistakes give one line on stderr and exit status 2."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from selfspec import cli
from selfspec.engine import SelfSpecModel
from tests.selfspec.tiny_text import save_model_dir

PROMPT = "Café au lait, crème brûlée. Café au"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir(tmp_path_factory.mktemp("cli") / "model", seed=2)


@pytest.fixture(scope="module")
def reference(model_dir):
    return SelfSpecModel.from_pretrained(model_dir, drafter="ngram")


def run_cli(*args, timeout=300):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "selfspec.cli", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def run_main(capsys, *args):
    code = cli.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code, err, *words):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(w in lines[0] for w in words), lines[0]


# -- end to end --------------------------------------------------------------------------------------------

def test_generate_streams_the_completion_and_summarises_on_stderr(model_dir, reference):
    done = run_cli("generate", "--model", model_dir, "--prompt", PROMPT, "--max-new-tokens", "30", "--threads", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout == reference.generate(PROMPT, max_new_tokens=30).text
    summary = done.stderr.strip().splitlines()
    assert len(summary) == 1
    assert all(w in summary[0] for w in ("tok/s", "tokens per target forward", "acceptance", "chains of drafts"))


def test_mistakes_give_one_line_and_status_2(tmp_path, model_dir):
    cases = [
        (["generate", "--model", model_dir, "--prompt", "x", "--bogus"], ["unrecognized arguments: --bogus"]),
        (["generate", "--model", str(tmp_path / "missing"), "--prompt", "x"], ["--model", "not a model directory"]),
        (["generate", "--model", str(tmp_path / "absent.gguf"), "--prompt", "x"], ["--model", "a .gguf file"]),
        (["generate", "--model", model_dir, "--prompt-file", str(tmp_path / "none.txt")], ["no such file"]),
        (["generate", "--model", model_dir, "--prompt", "x", "--top-p", "2"], ["--top-p"]),
        (["generate", "--model", model_dir], ["--prompt"]),
        (["frobnicate"], ["invalid choice"]),
        ([], ["COMMAND"]),
    ]
    for args, words in cases:
        done = run_cli(*args, timeout=60)  # answered before torch is imported: fast
        assert_one_line_error(done.returncode, done.stderr, *words)
        assert done.stdout == ""


def test_help_everywhere():
    for args in (["--help"], ["generate", "--help"]):
        done = run_cli(*args, timeout=60)
        assert done.returncode == 0 and "usage: selfspec" in done.stdout
    generate_help = run_cli("generate", "--help", timeout=60).stdout
    for flag in ("--model", "--heads", "--prompt-file", "--prompts-file", "--chat", "--drafter", "--max-new-tokens",
                 "--temperature", "--top-k", "--top-p", "--num-draft-tokens", "--seed", "--dtype", "--device",
                 "--threads", "--no-stream"):
        assert flag in generate_help
    assert generate_help.count("default") >= 15  # each default says why


def test_console_script_is_installed():
    script = shutil.which("selfspec")
    if script is None:
        pytest.skip("the selfspec console script is not on PATH (pip install -e .)")
    done = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "generate" in done.stdout


# -- generate, in-process ----------------------------------------------------------------------------------

class Recorder:
    """A stdout that records each write, to see the completion arrive in pieces."""

    def __init__(self):
        self.writes = []

    def write(self, text):
        self.writes.append(text)

    def flush(self):
        pass

    def isatty(self):
        return False


def test_streaming_and_no_stream_print_the_same_text(model_dir, reference, capsys, monkeypatch):
    args = ["generate", "--model", model_dir, "--prompt", PROMPT, "--max-new-tokens", "30", "--threads", "1"]
    code, streamed, err = run_main(capsys, *args)
    assert code == 0 and len(err.strip().splitlines()) == 1
    code, whole, _ = run_main(capsys, *args, "--no-stream")
    assert code == 0 and streamed == whole == reference.generate(PROMPT, max_new_tokens=30).text
    recorder = Recorder()
    monkeypatch.setattr(sys, "stdout", recorder)
    assert cli.main(args) == 0
    assert len(recorder.writes) > 1 and "".join(recorder.writes) == streamed  # it arrived in pieces


def test_chat_stop_eos_and_sampling_flags_reach_generate(model_dir, reference, capsys):
    base = ["generate", "--model", model_dir, "--max-new-tokens", "20", "--threads", "1"]
    code, out, _ = run_main(capsys, *base, "--prompt", "Bonjour", "--chat")
    assert code == 0
    assert out == reference.generate([{"role": "user", "content": "Bonjour"}], max_new_tokens=20).text
    code, out, _ = run_main(capsys, *base, "--prompt", PROMPT, "--stop", "op")
    assert code == 0 and out == reference.generate(PROMPT, max_new_tokens=20, stop_strings=["op"]).text
    assert out.endswith("op")
    free = reference.generate(PROMPT, max_new_tokens=20)
    eos = int(free.sequences[0, -15])
    code, out, _ = run_main(capsys, *base, "--prompt", PROMPT, "--eos-token-id", str(eos))
    assert code == 0 and out == reference.generate(PROMPT, max_new_tokens=20, eos_token_id=eos).text != free.text
    sampled = ["--prompt", PROMPT, "--temperature", "0.8", "--top-k", "50", "--seed", "3"]
    code, out, _ = run_main(capsys, *base, *sampled)
    expected = reference.generate(PROMPT, max_new_tokens=20, do_sample=True, temperature=0.8, top_k=50, seed=3)
    assert code == 0 and out == expected.text


def test_prompts_file_decodes_every_prompt_together_and_prints_json_lines(model_dir, reference, capsys, tmp_path,
                                                                           monkeypatch):
    import json

    import selfspec.batch.decode

    texts = [PROMPT, "Bonjour, crème", "Café"]
    path = tmp_path / "prompts.jsonl"
    lines = [json.dumps(texts[0]), "", json.dumps({"prompt": texts[1], "id": "b"}), json.dumps(texts[2])]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    batches = []
    decode_batch = selfspec.batch.decode.generate_batch
    monkeypatch.setattr(selfspec.batch.decode, "generate_batch",
                        lambda spec, prompts, *a: batches.append(len(prompts)) or decode_batch(spec, prompts, *a))
    code, out, err = run_main(capsys, "generate", "--model", model_dir, "--prompts-file", str(path),
                              "--max-new-tokens", "20", "--threads", "1")
    assert code == 0 and batches == [3]  # one batch of all three, not three calls
    records = [json.loads(line) for line in out.splitlines()]
    expected = [reference.generate(text, max_new_tokens=20) for text in texts]
    assert [r["index"] for r in records] == [0, 1, 2]
    assert [r["text"] for r in records] == [e.text for e in expected]
    assert [r["new_tokens"] for r in records] == [e.stats.new_tokens for e in expected] == [20, 20, 20]
    assert len(err.strip().splitlines()) == 1 and "3 prompt(s) decoded together" in err
    code, out, _ = run_main(capsys, "generate", "--model", model_dir, "--prompts-file", str(path), "--chat",
                            "--max-new-tokens", "8", "--threads", "1")
    chat = reference.generate([{"role": "user", "content": texts[1]}], max_new_tokens=8).text
    assert code == 0 and json.loads(out.splitlines()[1])["text"] == chat


def test_prompts_file_mistakes_say_which_line(model_dir, capsys, tmp_path):
    cases = [("\"fine\"\n{not json\n", ["line 2", "not JSON"]), ('{"text": "x"}\n', ["line 1", '"prompt" string']),
             ("[1, 2]\n", ["line 1"]), ("\n  \n", ["no prompts"])]
    for content, words in cases:
        path = tmp_path / "prompts.jsonl"
        path.write_text(content, encoding="utf-8")
        code, out, err = run_main(capsys, "generate", "--model", model_dir, "--prompts-file", str(path))
        assert_one_line_error(code, err, "--prompts-file", *words)
        assert out == ""
    code, _, err = run_main(capsys, "generate", "--model", model_dir, "--prompts-file", str(path), "--prompt", "x")
    assert_one_line_error(code, err, "not allowed with")


@pytest.mark.parametrize(
    "flags, expected",
    [
        ([], {"do_sample": False}),
        (["--temperature", "0"], {"do_sample": False}),
        (["--do-sample"], {"do_sample": True, "temperature": 1.0, "top_k": None, "top_p": None}),
        (["--temperature", "0.7"], {"do_sample": True, "temperature": 0.7, "top_k": None, "top_p": None}),
        (["--top-k", "5"], {"do_sample": True, "temperature": 1.0, "top_k": 5, "top_p": None}),
        (["--top-p", "0.9", "--temperature", "2"], {"do_sample": True, "temperature": 2.0, "top_k": None, "top_p": 0.9}),
    ],
)
def test_sampling_flags_map_onto_do_sample(flags, expected, model_dir):
    args = cli.build_parser().parse_args(["generate", "--model", model_dir, "--prompt", "x", *flags])
    assert cli._sampling(args) == expected


@pytest.mark.parametrize("flags, expected", [([], "auto"), (["--tree-size", "none"], None),
                                            (["--tree-size", "0"], 0), (["--tree-size", "12"], 12)])
def test_tree_size_defaults_to_auto_as_the_library_does(flags, expected, model_dir):
    args = cli.build_parser().parse_args(["generate", "--model", model_dir, "--prompt", "x", *flags])
    assert args.tree_size == expected


@pytest.mark.parametrize("flags, expected", [([], "auto"), (["--draft-dtype", "model"], "model"),
                                            (["--draft-dtype", "bfloat16"], "bfloat16")])
def test_draft_dtype_defaults_to_auto_as_the_library_does(flags, expected, model_dir, monkeypatch):
    from selfspec.engine import SelfSpecModel

    seen = {}
    monkeypatch.setattr(SelfSpecModel, "from_pretrained", classmethod(lambda cls, *a, **kw: seen.update(kw)))
    args = cli.build_parser().parse_args(["generate", "--model", model_dir, "--prompt", "x", *flags])
    assert args.draft_dtype == expected
    with pytest.raises(AttributeError):  # (the stub returns None, which has no tokenizer)
        cli._load(args)
    assert seen["draft_dtype"] == expected


def test_errors_found_after_parsing_are_one_line_too(tmp_path, model_dir, capsys):
    no_template = save_model_dir(tmp_path / "plain", chat_template=False)
    code, out, err = run_main(capsys, "generate", "--model", no_template, "--prompt", "hi", "--chat", "--threads", "1")
    assert_one_line_error(code, err, "no chat template")
    (tmp_path / "empty").mkdir()
    code, _, err = run_main(capsys, "generate", "--model", str(tmp_path / "empty"), "--prompt", "hi", "--threads", "1")
    assert_one_line_error(code, err)
    code, _, err = run_main(capsys, "generate", "--model", model_dir, "--prompt", "hi", "--drafter", "medusa")
    assert_one_line_error(code, err, "heads")
    code, _, err = run_main(capsys, "generate", "--model", model_dir, "--prompt", "x", "--temperature", "0", "--top-k", "3")
    assert_one_line_error(code, err, "--temperature 0")


def test_heads_that_cannot_load_give_one_line(tmp_path, model_dir, reference, capsys):
    """A heads directory whose config.json disagrees with its weights (load_state_dict's RuntimeError), and one
    without its weights, are one-line errors naming the directory, not tracebacks."""
    import json

    from heads import MedusaHeads

    edited, partial = tmp_path / "edited", tmp_path / "partial"
    for directory in (edited, partial):
        MedusaHeads.for_model(reference.model).save_pretrained(directory)
    config = json.loads((edited / "config.json").read_text())
    (edited / "config.json").write_text(json.dumps({**config, "num_heads": config["num_heads"] + 2}))
    (partial / "model.safetensors").unlink()
    base = ["generate", "--model", model_dir, "--prompt", "hi", "--max-new-tokens", "2", "--threads", "1"]
    code, out, err = run_main(capsys, *base, "--heads", str(edited))
    assert_one_line_error(code, err, str(edited), "config.json does not describe its model.safetensors")
    code, out, err = run_main(capsys, *base, "--heads", str(partial))
    assert_one_line_error(code, err, f"--heads {partial}", "no model.safetensors")
    assert out == ""


def test_an_empty_prompt_in_the_prompts_file_is_named_by_its_line(model_dir, capsys, tmp_path):
    path = tmp_path / "prompts.jsonl"
    for content in ('"hello"\n""\n', '"hello"\n{"prompt": ""}\n'):
        path.write_text(content, encoding="utf-8")
        code, out, err = run_main(capsys, "generate", "--model", model_dir, "--prompts-file", str(path))
        assert_one_line_error(code, err, "--prompts-file", "line 2", "an empty prompt")
        assert out == ""


@pytest.mark.parametrize("seed, words", [(str(2**64), ["--seed", "at most 64 bits"]),
                                         (str(-2**63 - 1), ["--seed", "expected an integer >="]),
                                         ("1.5", ["--seed", "expected an integer"])])
def test_a_seed_torch_cannot_take_is_refused_before_loading(model_dir, capsys, seed, words):
    code, out, err = run_main(capsys, "generate", "--model", model_dir, "--prompt", "hi", "--do-sample", "--seed", seed)
    assert_one_line_error(code, err, *words)
    args = cli.build_parser().parse_args(["generate", "--model", model_dir, "--prompt", "x", "--seed", str(2**64 - 1)])
    assert args.seed == 2**64 - 1  # torch's largest seed is still one


# -- forwarded commands ------------------------------------------------------------------------------------

def test_forwarded_commands(monkeypatch, capfd, tmp_path):
    monkeypatch.setitem(cli.FORWARDED, "bench", ("selfspec.no_such_module", "missing"))
    assert cli.main(["bench", "--anything"]) == 1
    err = capfd.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "selfspec.no_such_module" in err
    (tmp_path / "stand_in_bench.py").write_text(
        "import argparse, sys\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--runs', type=int)\n"
        "print(sys.argv[1:], parser.parse_args().runs)\n"
        "sys.exit(3)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))  # for find_spec here
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # for the child
    monkeypatch.setitem(cli.FORWARDED, "bench", ("stand_in_bench", "a stand-in with its own argparse"))
    assert cli.main(["bench", "--runs", "2"]) == 3  # the module's exit status comes back
    assert capfd.readouterr().out == "['--runs', '2'] 2\n"  # its arguments went through untouched
