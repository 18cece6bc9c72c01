"""The benchmark's phases, in order, each followed by writing every output: the main table (every method in greedy,
sampled and seeded sampled modes), then, when asked for, the num_draft_tokens sweep (greedy) and the useless-drafts
check. A time limit keeps what finished.
"""
from __future__ import annotations

import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from selfspec.bench.machine import machine_info
from selfspec.bench.methods import (
    GREEDY, KEYED, KEYED_T1, SAMPLE, SAMPLE_T1, SEEDED, Method, Mode, selfspec_method, transformers_method,
)
from selfspec.bench.models import Loaded, check_paths, load, parameters
from selfspec.bench.prompts import label, prompt_ids, prompt_texts
from selfspec.bench.report import markdown, write_outputs
from selfspec.bench.schedule import Deadline, run_schedule, warm_up
from selfspec.bench.settings import BenchSettings, model_name, parse_args, tree_size
from selfspec.bench.step_time import describe_breakdown, step_breakdown
from selfspec.bench.summary import summarize
from selfspec.bench.useless import useless_cases
from selfspec.engine import SelfSpecModel

GENERATE = "generate"
OFF = "selfspec speculation off"
BASELINES = {"speedup": GENERATE, "vs_speculation_off": OFF}
# greedy tokens must equal generate's; seeded (and keyed: one drawn seed per prompt and round for every method) ones
# speculation off's with the same seed (what an engine whose seeded tokens do not depend on drafting gives)
IDENTICAL_TO = {GREEDY.name: GENERATE, SEEDED.name: OFF, KEYED.name: OFF, KEYED_T1.name: OFF}
# keyed rows are priced against unseeded speculation off at their temperature: beside the unseeded rows' own
# "vs speculation off", the two unseeded paths' speeds share one denominator
ACROSS_MODES = {"vs_unseeded_off": (OFF, {KEYED.name: SAMPLE.name, KEYED_T1.name: SAMPLE_T1.name})}


def main_modes(settings: BenchSettings) -> tuple[Mode, ...]:
    """The main table's modes: greedy, sampled and seeded (the README's table); --t1 and --unseeded-keyed add theirs."""
    modes = [GREEDY, SAMPLE] + ([KEYED] if settings.unseeded_keyed else []) + [SEEDED]
    if settings.t1:
        modes += [SAMPLE_T1] + ([KEYED_T1] if settings.unseeded_keyed else [])
    return tuple(modes)


def main(argv=None) -> dict:
    """Run the benchmark from command-line arguments; returns the report (also written to --out)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    settings = parse_args(argv)
    check_paths(settings)
    if settings.llama_cpp:
        from selfspec.bench import llama_cpp

        llama_cpp.check(settings.model)  # before loading anything: the package, and a GGUF model
    _set_threads(settings.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    started, deadline = time.perf_counter(), Deadline(settings.time_limit)
    machine = machine_info(settings.device, settings.threads)
    notes: list[str] = []
    report = {"command": shlex.join(["python", "-m", "selfspec.bench", *argv]), "machine": machine,
              "settings": asdict(settings), "model_name": model_name(settings.model),
              "records": [], "sweep": [], "useless_drafts": [], "verify_cost": {}, "notes": notes,
              "phases_finished": [], "stopped_by_time_limit": False, "seconds": 0.0}
    if settings.device == "cpu" and machine["load_average_1min"] > machine["cpus_available"] - settings.threads:
        notes.append(f"the machine was busy at the start (load average {machine['load_average_1min']:.1f} on "
                     f"{machine['cpus_available']} CPUs): expect noisier timings than on an idle machine")
    if settings.dtype != "float32":
        notes.append(f"{settings.dtype}: a forward over several tokens rounds differently from one over a single "
                     "token, so any speculative method's greedy tokens (transformers' too) can part from plain "
                     "generate's at near-ties")
    loaded = load(settings, notes)
    from selfspec.kernel.backends import describe, measured_choices

    machine["quantized_backends_measured"] = measured_choices()  # (what loading the model chose, now measured)
    machine["quantized_products"] = describe(loaded.model)
    if settings.device == "cpu":  # (GPU timings would need synchronizing; the table's rows say enough there)
        report["step_breakdown"] = step_breakdown(loaded.model)
    report["base_parameters"] = base = parameters(loaded.transformers_model)[0]
    kind, texts = prompt_texts(loaded.tokenizer, settings.num_prompts)
    report["prompt_kind"], report["prompts"] = kind, [label(t) for t in texts]
    max_positions = getattr(loaded.model.config.get_text_config(decoder=True), "max_position_embeddings", None)
    prompts = prompt_ids(loaded.tokenizer, texts, kind, max_positions, settings.max_new_tokens, settings.device)
    methods, specs = main_methods(settings, loaded, notes)
    modes = main_modes(settings)
    # transformers' and llama.cpp's modes: neither takes selfspec's seed=
    modes_of = {m.name: tuple(mode for mode in modes if not mode.selfspec_only) for m in methods
                if m.family != "selfspec"}
    warm_up(methods, prompts[0][:, -32:], modes, modes_of)
    out = Path(settings.out)

    def finish_phase(name: str, stopped: bool) -> bool:
        """Write everything so far; True when the time limit says stop."""
        report["seconds"] = round(time.perf_counter() - started, 1)
        report["verify_cost"] = _verify_costs(methods)
        if stopped:
            report["stopped_by_time_limit"] = True
            notes.append(f"stopped by --time-limit {settings.time_limit:g} s during the {name} phase: its unfinished "
                         "round was dropped and later phases did not run")
        else:
            report["phases_finished"].append(name)
        write_outputs(report, out)
        return stopped

    print(f"main table: {len(methods)} methods x {len(modes)} modes x {len(prompts)} prompts x {settings.repeats} "
          f"rounds; writing to {out}", file=sys.stderr)
    entries, stopped = run_schedule(methods, prompts, modes, settings.repeats, settings.seed, "main", deadline,
                                    modes_of=modes_of)
    report["records"] = summarize(entries, [m.name for m in methods], BASELINES, base, IDENTICAL_TO, ACROSS_MODES)
    if "step_breakdown" in report:
        off = next((r["tokens_per_second"] for r in report["records"] if r["method"] == OFF
                    and r["mode"] == GREEDY.name), None)
        notes.append(describe_breakdown(report["step_breakdown"], off))
    if not finish_phase("main", stopped):
        report["sweep"], stopped = sweep(settings, loaded, specs, methods[:1] + [_off(methods)], prompts, deadline)
        if not finish_phase("sweep", stopped):
            report["useless_drafts"], stopped = useless_drafts(settings, loaded, prompts, deadline, notes)
            finish_phase("useless drafts", stopped)
    print(markdown(report))
    return report


def _set_threads(threads: int) -> None:
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or parallel work has started (e.g. when called from a test)
        pass


def _off(methods: list[Method]) -> Method:
    return next(m for m in methods if m.name == OFF)


def main_methods(settings: BenchSettings, loaded: Loaded, notes: list[str]) -> tuple[list[Method], dict]:
    """(the main table's methods, {drafter: SelfSpecModel drafting chains} for the sweep).

    By default: generate, speculation off, then every selfspec drafter at its defaults (ngram, early exit, and
    medusa, eagle, eagle3 where their heads are loaded; trees where tree_size="auto" drafts them), with EAGLE's chain
    beside its tree. Flags add rows: transformers' assisted generation, llama.cpp, a fixed num_draft_tokens per
    drafter (--fixed-k), and --chains, --kernel-off and --tree-size variants of the head drafters."""
    model, eos, pad, n = loaded.model, loaded.eos_token_id, loaded.pad_token_id, settings.max_new_tokens
    layer, lookup = loaded.exit_layer, settings.prompt_lookup_tokens
    plain = loaded.transformers_model  # transformers' rows run the model as transformers loads it
    methods = [transformers_method(GENERATE, plain, n, eos, pad)]
    if settings.transformers_assisted:
        methods += [
            transformers_method(f"transformers prompt lookup k={lookup}", plain, n, eos, pad, "prompt_lookup", lookup,
                                prompt_lookup_num_tokens=lookup),
            transformers_method(f"transformers early exit L={layer}", plain, n, eos, pad, "early_exit",
                                assistant_early_exit=layer),
        ]
        notes.append("transformers' early exit and draft model run with generate's defaults for assisted generation; "
                     f"prompt lookup with prompt_lookup_num_tokens={lookup} and its default max_matching_ngram_size")
    if loaded.draft is not None:
        methods.append(transformers_method("transformers draft model", plain, n, eos, pad, "draft_model",
                                           extra=loaded.draft, assistant_model=loaded.draft))
    specs, extras = {"none": SelfSpecModel(model, drafter="none", tokenizer=loaded.tokenizer)}, {}
    specs["ngram"] = SelfSpecModel(model, drafter="ngram")
    try:
        specs["early_exit"] = SelfSpecModel(model, drafter="early_exit", exit_layer=layer)
    except (ValueError, TypeError, NotImplementedError) as err:
        notes.append(f"selfspec early exit skipped: {err}")
    for drafter, heads in (("medusa", loaded.heads), ("eagle", loaded.eagle), ("eagle3", loaded.eagle3_dir)):
        if heads is None:
            continue
        try:  # the heads say which drafter they are for (an EAGLE-3 directory: its config)
            specs[drafter] = SelfSpecModel(model, heads=heads)
            extras[drafter] = specs[drafter].heads
        except (ValueError, TypeError, NotImplementedError, OSError) as err:
            notes.append(f"selfspec {drafter} skipped: {heads if isinstance(heads, str) else 'its heads'} do not "
                         f"draft for this model in this version ({err})")
    methods.append(selfspec_method(OFF, lambda: specs["none"], n, eos, "none"))
    chain_rows = {"eagle"} | ({"medusa", "eagle3"} if settings.chains else set())
    chains = {d: SelfSpecModel(model, heads=extras[d], tree_size=None) for d in extras
              if specs[d].tree_size and (d in chain_rows or settings.sweep_max > 0)}  # the sweep's, and chain rows
    if "eagle" in specs and "eagle" not in chains:
        notes.append(f"no eagle chain row: its default drafts chains here ({specs['eagle'].chain_reason})")
    trees = tree_specs(settings, model, extras, notes)
    for drafter, spec in specs.items():
        if drafter == "none":
            continue
        where = ""
        if drafter == "early_exit":
            where = f" L={layer}" + ("" if layer == loaded.trained_exit_layer else " untrained")
        # the default row (a tree where "auto" drafts one), then the chain, kernel-off and tree rows beside it
        variants = [(spec, f" tree={spec.tree_size}" if spec.tree_size else "")]
        if drafter in chains and drafter in chain_rows:
            variants.append((chains[drafter], " chain"))
        if settings.kernel_off and drafter in extras:
            variants.append((SelfSpecModel(model, heads=extras[drafter], few_row_kernel="off"), " kernel off"))
        tree = trees.get(drafter)
        shape_of = lambda s: (s.tree_size, s.min_node_probability)  # noqa: E731
        if tree is not None and shape_of(tree) != shape_of(spec):  # a tree row the default already is: not run twice
            variants.append((tree, f" tree={tree.tree_size}"))
        for variant, shape in variants:
            default = " (default)" if variant is spec else ""
            methods.append(selfspec_method(f"selfspec {drafter}{where}{shape}{default}", lambda s=variant: s, n, eos,
                                           drafter, extra=extras.get(drafter)))
            if settings.fixed_k:
                methods.append(selfspec_method(f"selfspec {drafter}{where}{shape} k={settings.fixed_k}",
                                               lambda s=variant: s, n, eos, drafter, settings.fixed_k,
                                               extra=extras.get(drafter)))
    if settings.llama_cpp:
        from selfspec.bench.llama_cpp import llama_cpp_method

        methods.append(llama_cpp_method(settings.model, n, eos, settings.threads, settings.seed))
        notes.append("llama.cpp decodes the same GGUF file with its own quantized arithmetic, so its greedy tokens "
                     "can part from generate's (which runs the dequantized float32 weights) at near-ties")
    return skipped(methods, settings.skip, notes), {**specs, **chains}


def skipped(methods: list[Method], skip: str | None, notes: list[str]) -> list[Method]:
    """`methods` less those whose name contains a part of `skip` (comma-separated); the two baselines always stay."""
    parts = [part.strip() for part in (skip or "").split(",") if part.strip()]
    kept = [m for m in methods if m.name in (GENERATE, OFF) or not any(part in m.name for part in parts)]
    left_out = [m.name for m in methods if m not in kept]
    if left_out:
        notes.append(f"left out with --skip: {', '.join(left_out)}")
    return kept


def tree_specs(settings: BenchSettings, model, extras: dict, notes: list[str]) -> dict:
    """{drafter: SelfSpecModel drafting trees of --tree-size} for the head drafters loaded (none without the flag)."""
    size = tree_size(settings)
    if size is None:
        return {}
    trees = {}
    for drafter in ("medusa", "eagle", "eagle3"):
        if drafter in extras:
            try:
                spec = SelfSpecModel(model, heads=extras[drafter], tree_size=size)
            except (ValueError, NotImplementedError) as err:
                notes.append(f"selfspec {drafter} trees skipped: {err}")
                continue
            if spec.tree_size:
                trees[drafter] = spec
            else:  # "auto" chose chains for this drafter
                notes.append(f"selfspec {drafter} --tree-size {size}: no tree row ({spec.chain_reason})")
    return trees


def _verify_costs(methods: list[Method]) -> dict:
    """The verify-cost curve each selfspec model measured (for a num_draft_tokens="auto" policy), when the engine
    exposes one; `verify_cost` is not part of the engine's promised interface, so it is optional here."""
    costs = {}
    for method in methods:
        measure = getattr(method.spec, "verify_cost", None)
        if method.num_draft_tokens is None and method.drafter != "none" and measure is not None:
            costs[method.name] = [round(c, 3) for c in measure().relative]
    return costs


def sweep(settings: BenchSettings, loaded: Loaded, specs: dict, baselines: list[Method], prompts, deadline):
    """num_draft_tokens 1..sweep_max per drafter, greedy, beside generate and speculation off (the k = 0 point)."""
    drafters = [d for d in specs if d != "none"]
    if settings.sweep_max <= 0 or not drafters:
        return [], False
    methods = baselines + [
        selfspec_method(f"selfspec {d} k={k}", lambda d=d: specs[d], settings.max_new_tokens, loaded.eos_token_id, d, k)
        for d in drafters for k in range(1, settings.sweep_max + 1)
    ]
    entries, stopped = run_schedule(methods, prompts[: settings.sweep_prompts], (GREEDY,), settings.repeats,
                                    settings.seed, "sweep", deadline)
    records = summarize(entries, [m.name for m in methods], {"speedup": GENERATE},
                        parameters(loaded.transformers_model)[0])
    return [r for r in records if r["method"] != GENERATE], stopped


def useless_drafts(settings: BenchSettings, loaded: Loaded, prompts, deadline, notes):
    """Every useless-drafts case in one schedule beside generate and speculation off, on the same prompts: each
    (round, prompt, mode) runs both baselines and every case of that mode, in a random order, so the baselines' runs
    serve every case (a schedule per case spent two thirds of the check's time on baselines, and left too few rounds
    to tell 0.95x from 1.00x on a noisy machine)."""
    if not settings.useless_prompts:  # --useless-prompts 0: the check is left out
        return [], False
    n = settings.max_new_tokens
    # Every run decodes exactly n tokens (no EOS stop): sampled runs of different methods draw different tokens, so
    # with EOS they stop at different lengths, and a short run's tokens/s carries more of its prefill (on the
    # reference model, a run cut to 10 of 96 tokens measured ~15 % slower for that alone).
    off = SelfSpecModel(loaded.model, drafter="none", tokenizer=loaded.tokenizer)
    baselines = [transformers_method(GENERATE, loaded.transformers_model, n, None, loaded.pad_token_id),
                 selfspec_method(OFF, lambda: off, n, [], "none")]
    cases = useless_cases(loaded, n, settings.seed, notes, eos_token_id=[])
    case_of = {case.method.name: case for case in cases}
    if len(case_of) < len(cases):
        raise ValueError("two useless-drafts cases share a method name: their rows could not be told apart")
    case_prompts = prompts[: settings.useless_prompts]
    methods = baselines + [case.method for case in cases]
    modes = tuple(dict.fromkeys(mode for case in cases for mode in case.modes))
    warm_up([case.method for case in cases], case_prompts[0][:, -32:],
            modes_of={case.method.name: case.modes for case in cases})
    entries, stopped = run_schedule(methods, case_prompts, modes, settings.repeats, settings.seed, "useless drafts",
                                    deadline, modes_of={case.method.name: case.modes for case in cases})
    summary = summarize(entries, [m.name for m in methods], {"speedup": GENERATE, "vs_speculation_off": OFF},
                        parameters(loaded.transformers_model)[0])
    records = [{"case": case_of[r["method"]].name, **r} for r in summary if r["method"] in case_of]
    order = [case.name for case in cases]
    return sorted(records, key=lambda r: order.index(r["case"])), stopped  # (stable: each case's modes in order)
