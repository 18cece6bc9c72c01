"""Several prompts at once: selfspec's batched decoding against `transformers`' batched `generate` (left-padded,
greedy) and against the same prompts decoded one by one, at batch sizes 1, 4, 8 and 16.

    python -m selfspec.bench.batch --model examples/reference/model --heads examples/reference/heads \\
        --batch-sizes 1,4,8,16 --max-new-tokens 96 --repeats 3

For each batch size B the first B held-out prompts (cycled when fewer ship) run through four methods, in a fresh
random order each round: `selfspec batch` (one generate call with the B prompts), `selfspec batch, no drafts` (the
same at num_draft_tokens=0: the batched loop's gain without speculation), `transformers batched` (one
`generate` over the left-padded batch) and `selfspec one by one` (B generate calls in turn). Reported per method,
as medians over rounds: throughput (new tokens per second of wall time), per-row latency (seconds from the start
until that row's last token: a batched selfspec row leaves when it stops, a transformers row waits for the whole
batch, a one-by-one row waits for those before it), and how many rows' tokens equal selfspec one by one's (exact
greedy decoding of each prompt alone). Writes results.md and results.json to --out. Knows nothing about how the
methods decode.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch

from selfspec.bench.settings import REFERENCE, default_out, model_name


@dataclass(frozen=True)
class BatchBenchSettings:
    model: str = str(REFERENCE / "model")
    heads: str | None = None
    exit_layer: int | None = None
    batch_sizes: str = "1,4,8,16"
    max_new_tokens: int = 96
    num_draft_tokens: str = "auto"
    repeats: int = 3
    threads: int = 1
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    out: str | None = None


HELP = {
    "model": "target model: a directory, a .gguf file, or `smollm2`; the project's reference model by default",
    "heads": "Medusa heads or EAGLE head directory (the drafter follows their kind); default: n-gram drafts",
    "exit_layer": "draft with early exit at this layer (the model's first L layers) instead of heads or n-gram; the "
                  "reference model was trained to exit at 2",
    "batch_sizes": "comma-separated batch sizes; each uses that many held-out prompts",
    "max_new_tokens": "tokens per row (EOS may end a row sooner, in every method alike)",
    "num_draft_tokens": "selfspec's num_draft_tokens: an int, or auto (the library's default)",
    "repeats": "rounds; every method runs once per batch size per round, in a random order; medians over rounds",
    "threads": "torch threads (1: a tiny model runs fastest on one, and timings are steadier)",
    "device": "cpu or cuda[:i]",
    "dtype": "the model's dtype (float32 on a CPU; bfloat16 rounds a batched forward differently from a single one, "
             "so rows may part from one-by-one at near-ties)",
    "seed": "seed of the method order",
    "out": "directory for results.md and results.json; default: bench-results/<model name>/batch/ in the working "
           "directory, beside the main benchmark's outputs (git-ignored in the repository)",
}


def parse_args(argv=None) -> BatchBenchSettings:
    parser = argparse.ArgumentParser(prog="python -m selfspec.bench.batch", description=__doc__.splitlines()[0])
    for f in fields(BatchBenchSettings):
        kind = int if f.type in ("int", "int | None") else str
        parser.add_argument("--" + f.name.replace("_", "-"), type=kind, default=None, metavar=f.name.upper(),
                            help=f"{HELP[f.name]} (default: {f.default})")
    given = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    settings = BatchBenchSettings(**given)
    try:
        sizes = batch_sizes(settings)
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        parser.error(f"--batch-sizes must be positive integers separated by commas, got {settings.batch_sizes!r}")
    if settings.repeats < 1 or settings.max_new_tokens < 1:
        parser.error("--repeats and --max-new-tokens must be >= 1")
    out = settings.out or str(default_out(settings.model) / "batch")
    return replace(settings, out=out)


def batch_sizes(settings: BatchBenchSettings) -> list[int]:
    return [int(s) for s in settings.batch_sizes.split(",") if s.strip()]


def num_draft_tokens(settings: BatchBenchSettings) -> int | str:
    return "auto" if settings.num_draft_tokens == "auto" else int(settings.num_draft_tokens)


@dataclass
class Timed:
    new_tokens: list[list[int]]  # per row, EOS included when generated, nothing after it
    seconds: float  # wall time of the whole batch
    latencies: list[float]  # per row: seconds from the start until its last token


def selfspec_batch(spec, prompts, settings, eos, drafts: bool = True) -> Timed:
    started = time.perf_counter()
    out = spec.generate([p[0] for p in prompts], max_new_tokens=settings.max_new_tokens,
                        num_draft_tokens=num_draft_tokens(settings) if drafts else 0, eos_token_id=eos)
    seconds = time.perf_counter() - started
    new = [s[p.shape[1]:].tolist() for s, p in zip(out.sequences, prompts)]
    return Timed(new, seconds, [s.seconds for s in out.row_stats])  # engine seconds of the steps each row was in


def selfspec_one_by_one(spec, prompts, settings, eos) -> Timed:
    new, latencies, started = [], [], time.perf_counter()
    for p in prompts:
        out = spec.generate(p, max_new_tokens=settings.max_new_tokens, num_draft_tokens=num_draft_tokens(settings),
                            eos_token_id=eos)
        new.append(out.sequences[0, p.shape[1]:].tolist())
        latencies.append(time.perf_counter() - started)
    return Timed(new, latencies[-1], latencies)


@torch.inference_mode()
def transformers_batched(model, prompts, settings, eos, pad) -> Timed:
    width = max(p.shape[1] for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long, device=prompts[0].device)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):  # left padding, as batched generation needs
        ids[r, width - p.shape[1]:], mask[r, width - p.shape[1]:] = p[0], 1
    started = time.perf_counter()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=settings.max_new_tokens, do_sample=False,
                         eos_token_id=eos, pad_token_id=pad)
    seconds = time.perf_counter() - started
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    new = []
    for row in out[:, width:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))  # finished rows are padded after EOS
        new.append(row[:end])
    return Timed(new, seconds, [seconds] * len(prompts))


# "no drafts": the same batched loop at num_draft_tokens=0, i.e. what the batch gains without speculation (on a CPU,
# selfspec's few-row kernel alone makes a batch's products cheaper than transformers' F.linear)
METHODS = ("selfspec batch", "selfspec batch, no drafts", "transformers batched", "selfspec one by one")


def run(settings: BatchBenchSettings) -> dict:
    from selfspec import SelfSpecModel
    from selfspec.bench.machine import machine_info
    from selfspec.bench.prompts import prompt_ids, prompt_texts
    from selfspec.loading import load_model, load_tokenizer

    torch.set_num_threads(settings.threads)
    model = load_model(settings.model, dtype=getattr(torch, settings.dtype), device=torch.device(settings.device))
    tokenizer = load_tokenizer(settings.model)
    # chains one by one too: a batch drafts chains, so batch 1 compares the batch machinery with one sequence's (a
    # single prompt's default, "auto", drafts trees where they pay: the main table measures those)
    if settings.exit_layer is not None and settings.heads is not None:
        raise SystemExit("--exit-layer and --heads name two drafters; give one")
    drafter = {} if settings.exit_layer is None else {"drafter": "early_exit", "exit_layer": settings.exit_layer}
    spec = SelfSpecModel(model, heads=settings.heads, tokenizer=tokenizer, tree_size=None, **drafter)
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else model.generation_config.eos_token_id
    pad = (eos[0] if isinstance(eos, list) else eos) if eos is not None else 0
    sizes = batch_sizes(settings)
    kind, texts = prompt_texts(tokenizer, min(max(sizes), 16))
    max_positions = getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", None)
    pool = prompt_ids(tokenizer, texts, kind, max_positions, settings.max_new_tokens, settings.device)
    batches = {b: [pool[i % len(pool)] for i in range(b)] for b in sizes}

    def call(method, prompts):
        if method == "selfspec batch":
            return selfspec_batch(spec, prompts, settings, eos)
        if method == "selfspec batch, no drafts":
            return selfspec_batch(spec, prompts, settings, eos, drafts=False)
        if method == "transformers batched":
            return transformers_batched(model, prompts, settings, eos, pad)
        return selfspec_one_by_one(spec, prompts, settings, eos)

    for method in METHODS:  # warm-up: first-call costs (the 4D-mask probe, allocator, kernels) off the clock
        call(method, [p[:, -16:] for p in pool[:2]])
    runs = {(b, m): [] for b in sizes for m in METHODS}
    for round_ in range(settings.repeats):
        for b in sizes:
            order = list(METHODS)
            random.Random(f"{settings.seed}/{round_}/{b}").shuffle(order)
            for method in order:
                runs[b, method].append(call(method, batches[b]))
                print(f"round {round_ + 1}/{settings.repeats} batch {b:>2} {method:<20} "
                      f"{runs[b, method][-1].seconds:7.2f}s", file=sys.stderr)
    records = [record(b, m, runs[b, m], runs[b, "selfspec one by one"], runs[b, "transformers batched"])
               for b in sizes for m in METHODS]
    return {"machine": machine_info(settings.device, settings.threads), "settings": asdict(settings),
            "model_name": model_name(settings.model), "drafter": type(spec.drafter).__name__, "prompt_kind": kind,
            "records": records}


def record(b: int, method: str, timed: list[Timed], alone: list[Timed], hf: list[Timed]) -> dict:
    """Medians over rounds; identity counted on every round's rows against selfspec one by one of the same round."""
    tokens = [sum(len(t) for t in x.new_tokens) for x in timed]
    throughput = statistics.median(n / x.seconds for n, x in zip(tokens, timed))
    reference = [statistics.median(sum(len(t) for t in x.new_tokens) / x.seconds for x in runs) for runs in (alone, hf)]
    identical = sum(a == b for x, y in zip(timed, alone) for a, b in zip(x.new_tokens, y.new_tokens))
    return {
        "batch_size": b, "method": method, "rounds": len(timed),
        "tokens_per_second": throughput,
        "vs_one_by_one": throughput / reference[0], "vs_transformers_batched": throughput / reference[1],
        "seconds": statistics.median(x.seconds for x in timed),
        "row_latency_median": statistics.median(statistics.median(x.latencies) for x in timed),
        "row_latency_max": statistics.median(max(x.latencies) for x in timed),
        "new_tokens": statistics.median(tokens),
        "identical_rows": identical, "rows": b * len(timed),
    }


def markdown(report: dict) -> str:
    s, m = report["settings"], report["machine"]
    lines = [
        f"# Batched decoding: {report['model_name']} ({report['drafter']}, {report['prompt_kind']} prompts)", "",
        f"`python -m selfspec.bench.batch --model {s['model']}" + (f" --heads {s['heads']}" if s["heads"] else "")
        + (f" --exit-layer {s['exit_layer']}" if s.get("exit_layer") is not None else "")
        + f" --batch-sizes {s['batch_sizes']} --max-new-tokens {s['max_new_tokens']} --repeats {s['repeats']}`", "",
        f"{m['device_name']}, {m['torch_threads']} torch thread(s), torch {m['torch']}, transformers "
        f"{m['transformers']}, {s['dtype']}, {m['date']}. Medians over {s['repeats']} rounds, methods in a random "
        "order per round and batch size. Latency: seconds from the start until the row's last token.", "",
        "| batch | method | tokens/s | vs one by one | vs transformers batched | row latency median / max (s) "
        "| rows = one by one |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["records"]:
        lines.append(
            f"| {r['batch_size']} | {r['method']} | {r['tokens_per_second']:.1f} | {r['vs_one_by_one']:.2f}x "
            f"| {r['vs_transformers_batched']:.2f}x | {r['row_latency_median']:.2f} / {r['row_latency_max']:.2f} "
            f"| {r['identical_rows']} of {r['rows']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    settings = parse_args(argv)
    import transformers

    transformers.logging.set_verbosity_error()
    report = run(settings)
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=2))
    (out / "results.md").write_text(markdown(report))
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
