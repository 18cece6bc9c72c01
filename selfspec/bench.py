"""The side-by-side benchmark: every way to decode one model faster, on held-out prompts, in one process.

    python -m selfspec.bench --quick                     # about two minutes on one CPU thread
    python -m selfspec.bench --json bench.json --plot bench.png --markdown bench.md
    python -m selfspec.bench --device cuda --dtype bfloat16 --quick

Methods: plain `model.generate`; transformers' prompt lookup, early exit and assisted generation with a separate
small draft model; selfspec with speculation off, and with each drafter at a fixed num_draft_tokens and at "auto".
Modes: greedy, sampling at temperature 1.0, and at 0.7 with top-p 0.9. Then a sweep of num_draft_tokens 1..8 per
drafter (greedy), and a check on useless drafts (random drafts; heads with random weights; random-token prompts).

Hygiene: a fixed torch thread count (default 1), a warm-up of every method, methods in a fresh random order for
every (round, prompt, mode), each run timed from outside with the device synchronised, medians over rounds with
their min-max spread, and the machine recorded. Knows schedules and settings; the methods live in
`bench_methods.py`, the tables, JSON and plot in `bench_report.py`.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from selfspec.bench_methods import (
    MODES, Method, RandomDrafter, kv_bytes_per_token, selfspec_method, transformers_method,
)
from selfspec.bench_report import Entry, machine_info, markdown, plot_sweep, summarize

REFERENCE = Path("examples/reference")
# What creates each default directory (examples/reference/README.md has the full commands and their figures).
MAKE_MODEL = "python -m training.base --out examples/reference/model ... (see examples/reference/README.md)"
MAKE_HEADS = "python -m training.heads --model examples/reference/model --data stdlib --out examples/reference/heads"
MAKE_DRAFT = ("python -m training.base --out examples/reference/draft --tokenizer examples/reference/model "
              "--hidden-size 128 --num-layers 2 ... (see examples/reference/README.md)")


@dataclass(frozen=True)
class BenchSettings:
    model: str = str(REFERENCE / "model")
    heads: str = str(REFERENCE / "heads")
    draft_model: str = str(REFERENCE / "draft")
    exit_adapter: str = str(REFERENCE / "exit-adapter")
    exit_layer: int | None = None
    num_draft_tokens: int = 3
    max_new_tokens: int = 128
    num_prompts: int = 8
    prompt_chars: int = 400
    repeats: int = 3
    sweep_max: int = 8
    sweep_prompts: int = 4
    useless_prompts: int = 3
    quick: bool = False
    threads: int = 1
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    json: str | None = None
    plot: str | None = None
    markdown: str | None = None


QUICK = dict(max_new_tokens=64, num_prompts=3, repeats=2, sweep_prompts=1, useless_prompts=1)

_HELP = {
    "model": "target model directory (transformers layout with tokenizer); the reference model by default",
    "heads": "Medusa heads directory for the model; 'none' skips the Medusa rows",
    "draft_model": "small model sharing the tokenizer, for transformers' two-model assisted generation; 'none' skips it",
    "exit_adapter": "exit adapter directory for selfspec's early exit; used only if it exists ('none': plain early exit)",
    "exit_layer": "layers that draft for early exit; default: the adapter's, else the layer the model was trained to "
                  "exit at (its training_log.json), else half the layers",
    "num_draft_tokens": "drafts per step in the main table (the sweep covers 1..--sweep-max); 3 suits a CPU, where "
                        "verifying k tokens costs about 1 + 0.15 k decodes",
    "max_new_tokens": "tokens per generation; 128 keeps prompt + output within the 256 positions the model trained on",
    "num_prompts": "held-out prompts (training.corpus.heldout_prompts: files the model never trained on)",
    "prompt_chars": "prompt length in characters (about 3.3 per token with the reference tokenizer)",
    "repeats": "rounds over all prompts; medians and min-max spreads are over rounds",
    "sweep_max": "the sweep tries num_draft_tokens 1 .. this, per drafter, greedy",
    "sweep_prompts": "prompts in the sweep (the first ones of the main set)",
    "useless_prompts": "prompts per useless-drafts case",
    "quick": f"a smaller run that finishes in about two minutes: {QUICK}",
    "threads": "torch threads; 1 gives stable latency on a small model (more threads spin against other processes)",
    "device": "cpu or cuda",
    "dtype": "model dtype: float32 (CPUs have no fast bf16), bfloat16 or float16",
    "seed": "seeds prompt choice, method order and sampling",
    "json": "write one record per method and mode (plus sweep, useless drafts, machine) to this path",
    "plot": "write a PNG of speedup and tokens per forward against num_draft_tokens, per drafter",
    "markdown": "write the tables to this path too",
}


def parse_args(argv=None) -> BenchSettings:
    parser = argparse.ArgumentParser(prog="python -m selfspec.bench", description=__doc__.split("\n\n")[0])
    for f in fields(BenchSettings):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            parser.add_argument(flag, action="store_true", help=_HELP[f.name])
        else:
            kind = int if f.type.startswith("int") else str
            parser.add_argument(flag, type=kind, default=None, metavar=f.name.upper(),
                                help=f"{_HELP[f.name]} (default: {f.default})")
    given = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None and v is not False}
    quick = QUICK if given.get("quick") else {}
    return BenchSettings(**{**quick, **given})


def _missing(path: str) -> bool:
    """True unless 'none' or a directory with a config.json (a half-written training output has none yet)."""
    return path.lower() != "none" and not (Path(path) / "config.json").is_file()


def check_paths(settings: BenchSettings) -> None:
    """One line, naming the command that creates what is missing."""
    if not (Path(settings.model) / "config.json").is_file():
        raise SystemExit(f"selfspec.bench: no model at {settings.model}; create it with `{MAKE_MODEL}` or pass --model DIR")
    if _missing(settings.heads):
        raise SystemExit(f"selfspec.bench: no Medusa heads at {settings.heads}; create them with `{MAKE_HEADS}`, "
                         "or pass --heads none to skip the Medusa rows")
    if _missing(settings.draft_model):
        raise SystemExit(f"selfspec.bench: no draft model at {settings.draft_model}; create it with `{MAKE_DRAFT}`, "
                         "or pass --draft-model none to skip two-model assisted generation")


# -- loading ------------------------------------------------------------------------------------------------------


@dataclass
class Loaded:
    model: object
    tokenizer: object
    heads: object | None
    draft: object | None
    adapter: object | None
    exit_layer: int
    eos_token_id: int | None


def load(settings: BenchSettings) -> Loaded:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = getattr(torch, settings.dtype)
    device = torch.device(settings.device)

    def model_from(path):
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()

    model = model_from(settings.model)
    tokenizer = AutoTokenizer.from_pretrained(settings.model)
    heads = draft = adapter = None
    if settings.heads.lower() != "none":
        from heads import MedusaHeads

        heads = MedusaHeads.from_pretrained(settings.heads, model=model).eval()
    if settings.draft_model.lower() != "none":
        draft = model_from(settings.draft_model)
    if settings.exit_adapter.lower() != "none" and Path(settings.exit_adapter).is_dir():
        from heads.exit_adapter import ExitAdapter

        adapter = ExitAdapter.from_pretrained(settings.exit_adapter, model=model).eval()
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else model.generation_config.eos_token_id
    return Loaded(model, tokenizer, heads, draft, adapter, _exit_layer(settings, model, adapter), eos)


def _exit_layer(settings: BenchSettings, model, adapter) -> int:
    if settings.exit_layer is not None:
        return settings.exit_layer
    if adapter is not None:
        return adapter.exit_layer
    log = Path(settings.model) / "training_log.json"
    if log.is_file():
        trained = json.loads(log.read_text()).get("settings", {}).get("early_exit_loss", 0)
        if trained:
            return int(trained)
    return max(1, model.config.num_hidden_layers // 2)


def heldout_prompt_ids(settings: BenchSettings, loaded: Loaded) -> list[torch.Tensor]:
    """[1, T] ids of held-out prompts (files never trained on), each leaving room for max_new_tokens."""
    from training.corpus import heldout_prompts

    texts = heldout_prompts(settings.num_prompts, prompt_chars=settings.prompt_chars, seed=settings.seed)
    ids = [loaded.tokenizer(t, return_tensors="pt").input_ids.to(settings.device) for t in texts]
    limit = getattr(loaded.model.config, "max_position_embeddings", None)
    if limit is not None:
        ids = [p[:, -(limit - settings.max_new_tokens - 1):] for p in ids]
    return ids


def random_prompt_ids(settings: BenchSettings, loaded: Loaded, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """Uniformly random token ids (never eos), as long as the held-out prompts: nothing for a draft to lean on."""
    g = torch.Generator().manual_seed(settings.seed + 1)
    vocab = loaded.model.get_output_embeddings().weight.shape[0]
    out = []
    for p in like:
        ids = torch.randint(0, vocab, p.shape, generator=g)
        ids[ids == loaded.eos_token_id] = (loaded.eos_token_id + 1) % vocab
        out.append(ids.to(p.device))
    return out


def random_heads(loaded: Loaded, seed: int):
    """Heads shaped like the trained ones whose blocks have large random weights: drafts that are almost never right."""
    from heads import MedusaHeads

    config = loaded.heads.config
    heads = MedusaHeads.for_model(loaded.model, config.num_heads, config.num_layers, config.share_lm_head)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 4 / p.shape[-1] ** 0.5)
    return heads.eval()


# -- methods ------------------------------------------------------------------------------------------------------


def build_methods(settings: BenchSettings, loaded: Loaded, notes: list[str]):
    """(main table methods, {drafter: SelfSpecModel}) for the drafters that can run on this model."""
    from selfspec import SelfSpecModel

    model, eos, n, k = loaded.model, loaded.eos_token_id, settings.max_new_tokens, settings.num_draft_tokens
    methods = [
        transformers_method("generate", model, n, eos),
        transformers_method(f"transformers prompt lookup k={k}", model, n, eos, "prompt_lookup", k,
                            prompt_lookup_num_tokens=k),
        transformers_method(f"transformers early exit L={loaded.exit_layer}", model, n, eos, "early_exit", None,
                            assistant_kv_per_token=kv_bytes_per_token(model, loaded.exit_layer),
                            assistant_early_exit=loaded.exit_layer),
    ]
    if loaded.draft is not None:
        methods.append(transformers_method("transformers draft model", model, n, eos, "draft_model", None,
                                           assistant_kv_per_token=kv_bytes_per_token(loaded.draft),
                                           extra=loaded.draft, assistant_model=loaded.draft))
    specs = {"none": SelfSpecModel(model, drafter="none", tokenizer=loaded.tokenizer)}
    extras = {"none": None, "ngram": None}
    if loaded.heads is not None:
        specs["medusa"], extras["medusa"] = SelfSpecModel(model, drafter="medusa", heads=loaded.heads), loaded.heads
    specs["ngram"] = SelfSpecModel(model, drafter="ngram")
    try:
        specs["early_exit"] = SelfSpecModel(model, drafter="early_exit", exit_layer=loaded.exit_layer,
                                            adapter=loaded.adapter)
        extras["early_exit"] = loaded.adapter
    except (ValueError, TypeError, NotImplementedError) as err:
        notes.append(f"selfspec early exit skipped: {err}")
    notes.append(f"transformers' early exit and draft model run with generate's defaults for assisted generation "
                 "(5.24: up to 20 draft tokens a step, drafting stops below 0.4 draft confidence); prompt lookup "
                 f"with prompt_lookup_num_tokens={k} and its default max_matching_ngram_size")
    auto = supports_auto(specs["none"], settings.device)
    if not auto:
        notes.append('num_draft_tokens="auto" is not available in this selfspec: no auto rows')
    methods.append(selfspec_method("selfspec speculation off", specs["none"], n, eos, 0, "none"))
    for drafter, spec in specs.items():
        if drafter == "none":
            continue
        methods.append(selfspec_method(f"selfspec {drafter} k={k}", spec, n, eos, k, drafter, extras[drafter]))
        if auto:
            methods.append(selfspec_method(f"selfspec {drafter} auto", spec, n, eos, "auto", drafter, extras[drafter]))
    return methods, specs, auto


def supports_auto(spec, device) -> bool:
    try:
        spec.generate(torch.tensor([1, 2, 3], device=device), max_new_tokens=2, num_draft_tokens="auto")
    except ValueError:
        return False
    return True


# -- schedules ----------------------------------------------------------------------------------------------------


def run_schedule(methods: list[Method], prompts, modes, repeats: int, seed: int, label: str) -> list[Entry]:
    """Every method on every prompt and mode, `repeats` rounds; a fresh random method order for each (round, prompt,
    mode) so no method always follows another (caches, allocator and CPU-frequency state are shared)."""
    entries, total, started = [], repeats * len(prompts) * len(modes) * len(methods), time.perf_counter()
    for round_ in range(repeats):
        for p, prompt in enumerate(prompts):
            for m, mode in enumerate(modes):
                order = list(methods)
                random.Random(hash((seed, round_, p, m))).shuffle(order)
                for method in order:
                    run_seed = seed * 1_000_003 + round_ * 1009 + p  # the same for every method: paired runs
                    entries.append(Entry(method, mode, round_, p, method.run(prompt, mode, run_seed)))
            done = len(entries)
            print(f"  {label}: {done}/{total} runs, {time.perf_counter() - started:.0f}s", file=sys.stderr, flush=True)
    return entries


def warm_up(methods: list[Method], prompt: torch.Tensor) -> None:
    """One greedy and one sampled run of each method on a short prompt (first-call allocations; the auto policy's
    measurement of this device's verify cost)."""
    for method in methods:
        for mode in (MODES[0], MODES[1]):
            method.run(prompt, mode, 0)


def main(argv=None) -> dict:
    settings = parse_args(argv)
    check_paths(settings)
    torch.set_num_threads(settings.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or parallel work has started (e.g. when called from a test)
        pass
    import transformers

    transformers.logging.set_verbosity_error()
    started = time.perf_counter()
    machine = machine_info(settings.device, settings.threads)
    report = {"machine": machine, "settings": asdict(settings), "records": [], "sweep": [], "useless_drafts": [],
              "notes": [], "seconds": 0.0}
    if machine["load_average_1min"] > machine["cpus_available"] - settings.threads and settings.device == "cpu":
        report["notes"].append(
            f"the machine was busy at the start (load average {machine['load_average_1min']:.1f} on "
            f"{machine['cpus_available']} CPUs): expect noisier timings than on an idle machine")

    if settings.dtype != "float32":
        report["notes"].append(
            f"{settings.dtype}: a forward over several tokens rounds differently from one over a single token, so the "
            "greedy tokens of any speculative method (transformers' too) can part from plain generate's at near-ties")
    loaded = load(settings)
    base_parameters = report["base_parameters"] = sum(p.numel() for p in loaded.model.parameters())
    prompts = heldout_prompt_ids(settings, loaded)
    report["prompts"] = [loaded.tokenizer.decode(p[0]).splitlines()[0] for p in prompts]  # first lines, to recognise them
    methods, specs, auto = build_methods(settings, loaded, report["notes"])
    warm_up(methods, prompts[0][:, -32:])
    # "auto" measures each SelfSpecModel's verify cost once (at warm-up) and plans with it: record what it saw.
    auto_specs = {d: spec for d, spec in specs.items() if d != "none"} if auto else {}

    def write(final: bool = False) -> None:
        """Outputs after every phase, so an interrupted run (a time limit) keeps the phases that finished."""
        report["seconds"] = round(time.perf_counter() - started, 1)
        machine["load_average_1min_at_end"] = os.getloadavg()[0]
        text = markdown(report)
        if final:
            print(text)
        if settings.markdown:
            Path(settings.markdown).write_text(text)
        report["verify_cost"] = {name: [round(c, 3) for c in spec.verify_cost().relative]
                                 for name, spec in auto_specs.items()}
        if settings.json:
            Path(settings.json).write_text(json.dumps(report, indent=2) + "\n")

    print(f"main table: {len(methods)} methods x {len(MODES)} modes x {len(prompts)} prompts x {settings.repeats} "
          "rounds", file=sys.stderr)
    report["records"] = summarize(run_schedule(methods, prompts, MODES, settings.repeats, settings.seed, "main"),
                                  "generate", base_parameters, methods)
    write()
    report["sweep"] = sweep(settings, loaded, specs, methods, prompts, base_parameters)
    write()
    if settings.plot and report["sweep"]:
        plot_sweep(report["sweep"], settings.plot, title=f"{Path(settings.model).name}, {machine['device_name']}, "
                                                         f"{settings.dtype}, {settings.threads} thread(s)")
    report["useless_drafts"] = useless_drafts(settings, loaded, specs, prompts, auto, base_parameters,
                                              auto_specs)
    write(final=True)
    return report


def sweep(settings: BenchSettings, loaded: Loaded, specs, methods, prompts, base_parameters) -> list[dict]:
    """num_draft_tokens 1..sweep_max per drafter, greedy, against generate (and speculation off, the k = 0 point)."""
    drafters = [d for d in ("medusa", "ngram", "early_exit") if d in specs]
    if settings.sweep_max <= 0 or not drafters:
        return []
    plain, off = methods[0], next(m for m in methods if m.name == "selfspec speculation off")
    sweep_methods = [plain, off] + [
        selfspec_method(f"selfspec {d} k={k}", specs[d], settings.max_new_tokens, loaded.eos_token_id, k, d)
        for d in drafters for k in range(1, settings.sweep_max + 1)
    ]
    entries = run_schedule(sweep_methods, prompts[: settings.sweep_prompts], MODES[:1], settings.repeats,
                           settings.seed, "sweep")
    return [r for r in summarize(entries, "generate", base_parameters, sweep_methods) if r["method"] != "generate"]


def useless_drafts(settings: BenchSettings, loaded: Loaded, specs, prompts, auto: bool, base_parameters,
                   auto_specs: dict) -> list[dict]:
    """Cases where drafts cannot help (random drafts; heads with random weights) and one where they may not (random-token
    prompts: a small model often repeats itself after them, which n-gram drafts then catch). The ratio that matters is
    against speculation off on the same prompts; the acceptance column shows how useless the drafts were."""
    from selfspec import SelfSpecModel

    n, eos, k = settings.max_new_tokens, loaded.eos_token_id, settings.num_draft_tokens
    policies = [k, "auto"] if auto else [k]
    real = prompts[: settings.useless_prompts]
    vocab = loaded.model.get_output_embeddings().weight.shape[0]
    cases = [("random drafts", real, {"random": SelfSpecModel(loaded.model, RandomDrafter(vocab, settings.seed))})]
    if loaded.heads is not None:
        noise = random_heads(loaded, settings.seed + 2)
        cases.append(("heads with random weights", real, {"medusa": SelfSpecModel(loaded.model, "medusa", heads=noise)}))
    cases.append(("random-token prompts", random_prompt_ids(settings, loaded, real),
                  {d: specs[d] for d in ("ngram", "medusa", "early_exit") if d in specs}))
    records = []
    for case, case_prompts, case_specs in cases:
        if auto:
            auto_specs.update({f"{case}: {d}": spec for d, spec in case_specs.items()})
        methods = [selfspec_method("selfspec speculation off", specs["none"], n, eos, 0, "none")] + [
            selfspec_method(f"selfspec {d} {'k=' if p != 'auto' else ''}{p}", spec, n, eos, p, d)
            for d, spec in case_specs.items() for p in policies
        ]
        warm_up(methods[1:], case_prompts[0][:, -32:])
        entries = run_schedule(methods, case_prompts, MODES[:1], settings.repeats, settings.seed, case)
        for record in summarize(entries, "selfspec speculation off", base_parameters, methods):
            if record["method"] != "selfspec speculation off":
                records.append({"case": case, **record})
    return records


if __name__ == "__main__":
    main()
