"""Round 24 (Intel Xeon with AMX, one thread): the reference model's batches of code prompts (or SmolLM2's chat
prompts with its EAGLE head), 96 tokens without EOS, paired and interleaved, per batch size in turn (as the batch
benchmark runs them): fixed k = 0 and "auto" with three ways to price a batch step beyond its forward: one line
through every step ("one line", `StepOverhead`, before round 24), plain and drafting steps apart over all numbers of
rows ("split, pooled"), and apart per number of rows ("split, by rows", `BatchStepOverhead`, round 24); each "auto"
variant in its own wrapper (its own overhead, cost curve and rates, kept across its calls as the engine keeps them).
Prints per batch size the median seconds and the median of per-round ratios k0 / variant, and checks every variant's
rows are identical.
Usage: python examples/adhoc/r24_batch_overhead_ab.py ROUNDS [SIZES, default 4,8,16] [reference|smollm2]"""
import statistics
import sys
import time

import torch
import transformers
from harness import interleaved, reference_batch

from selfspec.batch_draft_length import BatchStepOverhead
from selfspec.draft_length import StepOverhead
from selfspec.engine import SelfSpecModel

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()


class IgnoresRows:
    """Prices and learns every step alike, whatever its number of rows (what the two variants below share)."""

    def predict(self, num_drafted, num_rows=None):
        return super().predict(num_drafted)

    def observe(self, num_drafted, residual, num_rows=None):
        super().observe(num_drafted, residual)


class OneLine(IgnoresRows, StepOverhead):
    pass


class Pooled(IgnoresRows, BatchStepOverhead):
    pass


sizes = [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else "4,8,16").split(",")]
model_name = sys.argv[3] if len(sys.argv) > 3 else "reference"
if model_name == "smollm2":
    from harness import smollm2_chat
    model, tokenizer, chats = smollm2_chat(max(sizes), 96)
    pool, heads = [c[0] for c in chats], "examples/smollm2/eagle"
else:
    by_rows, pool = reference_batch(max(sizes))
    model, tokenizer, heads = by_rows.model, by_rows.tokenizer, "examples/reference/heads"
specs = {}
for name, overhead in (("one line", OneLine), ("split, pooled", Pooled), ("split, by rows", BatchStepOverhead)):
    specs[name] = SelfSpecModel(model, heads=heads, tokenizer=tokenizer)
    specs[name]._batch_overhead = overhead(0.9)
variants = {"k0": (specs["split, by rows"], 0), **{name: (spec, "auto") for name, spec in specs.items()}}
kw = dict(max_new_tokens=96, eos_token_id=[])
for spec in specs.values():
    spec.generate([p[-16:] for p in pool[:2]], **kw)  # warm-up
seconds = {(b, name): [] for b in sizes for name in variants}
first_rows = {}


def run(name, b):
    spec, k = variants[name]
    started = time.perf_counter()
    out = spec.generate(pool[:b], num_draft_tokens=k, **kw)
    seconds[(b, name)].append(time.perf_counter() - started)
    rows = [s.tolist() for s in out.sequences]
    assert first_rows.setdefault(b, rows) == rows, f"{name} at batch {b}: rows differ"


for _ in range(int(sys.argv[1])):
    for b in sizes:
        for _ in interleaved(list(variants), [b], 1, run, seed=len(seconds[(b, 'k0')])):
            pass
    print(" ".join(f"b{b} " + "/".join(f"{seconds[(b, n)][-1]:.2f}" for n in variants) for b in sizes), flush=True)
for b in sizes:
    base = seconds[(b, "k0")]
    parts = []
    for name in variants:
        ratio = statistics.median(x / y for x, y in zip(base, seconds[(b, name)]))
        parts.append(f"{name} {statistics.median(seconds[(b, name)]):.2f}s (k0 / it {ratio:.3f}x)")
    print(f"batch {b}: " + ", ".join(parts) + ", rows identical")
