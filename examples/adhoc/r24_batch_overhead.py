"""Round 24 (Intel Xeon with AMX, one thread): the reference model's batch of B (default 8) code prompts, 96 tokens
without EOS: fixed k = 0, 1, 2, 3 and "auto", interleaved, ROUNDS rounds; prints each call's seconds, then, from every
timed step of the "auto" calls (recorded in `BatchDraftLength.observe`), the median verify forward and the median rest
of the step (drafting, verification, bookkeeping) in ms per width, shadow probes apart, and what the wrapper's
`batch_step_overhead` learned. Round 24's finding: the rest is ~1.8 ms at w = 0 and ~3.6-4.7 ms at any w > 0, a fixed
cost of drafting that one line through both kinds of steps charged to w = 0 too (`BatchStepOverhead`).
Usage: python examples/adhoc/r24_batch_overhead.py ROUNDS [B]"""
import collections
import statistics
import sys
import time

import torch
import transformers
from harness import interleaved, reference_batch

import selfspec.batch_draft_length as bdl

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()

batch = int(sys.argv[2]) if len(sys.argv) > 2 else 8
spec, prompts = reference_batch(batch)
steps = collections.defaultdict(list)  # (width, shadow probe) -> [(verify ms, rest ms)]
observe = bdl.BatchDraftLength.observe


def recorded(self, drafted, num_accepted, verify_seconds, step_seconds):
    steps[(max(drafted), self.probe_in_shadow())].append((verify_seconds * 1e3, (step_seconds - verify_seconds) * 1e3))
    return observe(self, drafted, num_accepted, verify_seconds, step_seconds)


bdl.BatchDraftLength.observe = recorded
kw = dict(max_new_tokens=96, eos_token_id=[])
spec.generate([p[-16:] for p in prompts[:2]], **kw)  # warm-up
variants = {"k0": 0, "k1": 1, "k2": 2, "k3": 3, "auto": "auto"}
seconds = collections.defaultdict(list)


def run(name, _):
    started = time.perf_counter()
    spec.generate(prompts, num_draft_tokens=variants[name], **kw)
    seconds[name].append(time.perf_counter() - started)
    print(name, f"{seconds[name][-1]:.2f}s", flush=True)


for _ in interleaved(list(variants), [None], int(sys.argv[1]), run):
    pass
for name in variants:
    print(name, f"median {statistics.median(seconds[name]):.2f}s",
          f"k0 / this {statistics.median(seconds['k0']) / statistics.median(seconds[name]):.3f}x")
for (width, shadow), values in sorted(steps.items()):
    print(f"w = {width}{' (shadow probe)' if shadow else ''}: {len(values)} steps, verify "
          f"{statistics.median(v[0] for v in values):.2f} ms, rest {statistics.median(v[1] for v in values):.2f} ms")
overhead = spec.batch_step_overhead()
if hasattr(overhead, "plain"):
    print(f"learned (one-row decodes): plain {overhead.plain.per_step:.3f}, drafting {overhead.drafting.per_step:.3f}"
          f" + {overhead.drafting.per_token:.3f} per drafted token")
else:
    print(f"learned (one-row decodes): {overhead.per_step:.3f} + {overhead.per_token:.3f} per drafted token")
