"""Round 18 (Intel Xeon, AVX-512, one thread): the reference model's batch of B code prompts, 96 tokens without EOS,
num_draft_tokens="auto" against a fixed k = 0 with one wrapper, interleaved in a random order per round; median time
of each, and "auto" as a multiple of k = 0's speed. Before round 18's planner fixes (8ed5ccb) batch 16 read 0.81-0.89x,
batch 4 0.92-0.94x; after (2ea3669) 0.95x and 0.94x (5 rounds each).
Usage: python examples/adhoc/r18_batch_auto_ab.py B ROUNDS"""
import random
import statistics
import sys
import time

import torch
import transformers
from harness import reference_batch  # (examples/adhoc/harness.py)

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
batch, rounds = int(sys.argv[1]), int(sys.argv[2])
spec, prompts = reference_batch(batch)
kw = dict(max_new_tokens=96, eos_token_id=[])
variants = [0, "auto"]
for k in variants:  # warm-up
    spec.generate(prompts, num_draft_tokens=k, **kw)
times = {k: [] for k in variants}
rng = random.Random(0)
for _ in range(rounds):
    order = list(variants)
    rng.shuffle(order)
    for k in order:
        started = time.perf_counter()
        spec.generate(prompts, num_draft_tokens=k, **kw)
        times[k].append(time.perf_counter() - started)
base = statistics.median(times[0])
for k in variants:
    median = statistics.median(times[k])
    print(f"batch {batch}, k = {k}: {median:.3f} s, {base / median:.2f}x of k = 0")
