"""Round 30 (Intel Xeon with AMX, one thread): what batch "auto" pays where no width pays, split up. The reference
model's batch of B code prompts (Medusa heads), 96 tokens stopping at EOS, one wrapper, interleaved: "auto"; "zero"
(the planner chooses as "auto" does, then runs w = 0 with no probe: what choosing costs); "nochoose" (the planner
returns 0 without choosing: what the rest of the "auto" loop costs at w = 0); "k0" (num_draft_tokens=0). Prints each
variant's median seconds and the median per-round ratio k0 / variant.
Usage: python examples/adhoc/r30_batch_overhead.py ROUNDS [B]   (from the repository root, PYTHONPATH=examples/adhoc)"""
import statistics
import sys
import time

import torch
import transformers
from harness import interleaved, reference_batch

import selfspec.batch as batch_loop
from selfspec.batch_draft_length import BatchDraftLength

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
rounds = int(sys.argv[1])
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 16
spec, prompts = reference_batch(batch, 96)
eos = spec.tokenizer.eos_token_id


class Zero(BatchDraftLength):
    def choose(self, rows):
        super().choose(rows)
        self.probes.probing = False
        return 0


class NoChoose(BatchDraftLength):
    def choose(self, rows):
        return 0


variants = {"auto": (BatchDraftLength, "auto"), "zero": (Zero, "auto"), "nochoose": (NoChoose, "auto"),
            "k0": (BatchDraftLength, 0)}
seconds = {name: [] for name in variants}


def run(name, _):
    batch_loop.BatchDraftLength, k = variants[name]
    started = time.perf_counter()
    spec.generate(prompts, max_new_tokens=96, num_draft_tokens=k, eos_token_id=eos)
    seconds[name].append(time.perf_counter() - started)


for name, (planner, k) in variants.items():  # warm-up
    batch_loop.BatchDraftLength = planner
    spec.generate(prompts, max_new_tokens=16, num_draft_tokens=k, eos_token_id=eos)
for _ in interleaved(list(variants), [None], rounds, run):
    pass
for name in variants:
    ratio = statistics.median(k0 / it for k0, it in zip(seconds["k0"], seconds[name]))
    print(f"{name}: median {statistics.median(seconds[name]):.3f}s, k0 / it per round {ratio:.3f}x")
print(f"reference batch {batch}, 96 tokens, {rounds} rounds")
