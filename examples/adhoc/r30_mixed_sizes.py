"""Round 30 (Intel Xeon with AMX, one thread): batch "auto" at batch B when the same wrapper also decodes batches of
other sizes, as the batch benchmark runs them (every size in each round, one wrapper). Per round: batches of 4 and 8
with "auto", then batch B with "auto" and with no drafts (k0) in a random order; prints each batch-B "auto" call's
widths (a digit per step, "p" a probe) and the median per-round ratio k0 / auto at batch B; with ISOLATED=1 a second
wrapper decodes only batch B, for comparison.
Usage: python examples/adhoc/r30_mixed_sizes.py ROUNDS [B]   (from the repository root, PYTHONPATH=examples/adhoc)"""
import os
import random
import statistics
import sys
import time

import torch
import transformers
from harness import reference_batch

import selfspec.batch_draft_length as bdl
from selfspec.engine import SelfSpecModel

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
rounds = int(sys.argv[1])
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 16
spec, prompts = reference_batch(16, 96)
isolated = SelfSpecModel(spec.model, heads="examples/reference/heads", tokenizer=spec.tokenizer)
eos = spec.tokenizer.eos_token_id
widths = []
choose = bdl.BatchDraftLength.choose


def logged_choose(self, rows):
    width = choose(self, rows)
    widths.append("p" if self.probes.probing else str(width))
    return width


bdl.BatchDraftLength.choose = logged_choose
seconds = {"mixed auto": [], "k0": [], "isolated auto": []}


def call(wrapper, size, k="auto"):
    widths.clear()
    started = time.perf_counter()
    wrapper.generate(prompts[:size], max_new_tokens=96, num_draft_tokens=k, eos_token_id=eos)
    return time.perf_counter() - started


for size in (2, 4, 8, batch):  # warm-up
    call(spec, size), call(isolated, size)
order = random.Random(0)
for _ in range(rounds):
    call(spec, 4), call(spec, 8)
    names = ["mixed auto", "k0"] + (["isolated auto"] if os.environ.get("ISOLATED") else [])
    for name in order.sample(names, len(names)):
        seconds[name].append(call(isolated if name == "isolated auto" else spec, batch, 0 if name == "k0" else "auto"))
        if name != "k0":
            print(f"{name} {seconds[name][-1]:.2f}s {''.join(widths)}", flush=True)
for name, values in seconds.items():
    if values:
        ratio = statistics.median(k / v for k, v in zip(seconds["k0"], values))
        print(f"{name}: median {statistics.median(values):.2f}s, k0 / it per round {ratio:.3f}x")
