"""Round 27 (Intel Xeon with AMX, one thread): what a batched verify forward costs per shape (rows, 1 + width), as
the batch loop runs it (`selfspec.batch._forward_block` through the wrapper's few-row kernel and its CPU
attention path, then the LM head over
every row's block), after a ragged cache of about CONTEXT tokens per row. Shapes interleaved, ROUNDS rounds, each
shape's median in one-row decodes (rows 1, width 0). Tells whether a forward's cost follows its total tokens (the
batch curve's index) or its rows and drafted tokens apart.
Usage: python examples/adhoc/r27_batch_shapes.py MODEL(smollm2|reference) ROUNDS [CONTEXT] [ROWS, e.g. 1,8,16]"""
import random
import statistics
import sys
import time

import torch
import transformers

from selfspec.attention_backends import grouped_kv_in_kernel
from selfspec.batch import _forward_block
from selfspec.batch_cache import RaggedCache
from selfspec.engine import SelfSpecModel

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
which, rounds = sys.argv[1], int(sys.argv[2])
context = int(sys.argv[3]) if len(sys.argv) > 3 else 160
row_counts = [int(r) for r in sys.argv[4].split(",")] if len(sys.argv) > 4 else [1, 2, 4, 8, 12, 16]
if 1 not in row_counts:
    row_counts.insert(0, 1)  # (the unit)
if which == "smollm2":
    from harness import smollm2_chat
    model = smollm2_chat(1, 8)[0]
else:
    from selfspec.loading import load_model
    model = load_model("examples/reference/model")
spec = SelfSpecModel(model, drafter="ngram")
target = spec.target
shapes = [(r, n) for r in row_counts for n in (1, 2, 3, 5)]
caches = {}
generator = torch.Generator().manual_seed(0)
with torch.inference_mode(), spec.few_row_linears, grouped_kv_in_kernel():
    for rows in {r for r, _ in shapes}:
        cache = RaggedCache(model, rows, target.device)
        lengths = [context - 8 * (i % 4) for i in range(rows)]
        ids = torch.randint(0, target.vocab_size, (rows, context), generator=generator)
        _forward_block(target, cache, ids)
        cache.commit(torch.tensor(lengths))
        caches[rows] = cache
    seconds = {s: [] for s in shapes}
    order = random.Random(0)
    for round_ in range(rounds + 1):
        for rows, n in order.sample(shapes, len(shapes)):
            cache = caches[rows]
            block = torch.randint(0, target.vocab_size, (rows, n), generator=generator)
            started = time.perf_counter()
            hidden = _forward_block(target, cache, block)
            target.logits(hidden.reshape(rows * n, -1))
            took = time.perf_counter() - started
            cache.commit(torch.zeros(rows, dtype=torch.long))
            if round_:
                seconds[(rows, n)].append(took)
decode = statistics.median(seconds[(1, 1)])
print(f"{which}: one-row decode {decode * 1e3:.1f} ms; median cost per shape in one-row decodes (context {context})")
print("rows " + "".join(f"  w={n - 1:<5}" for n in (1, 2, 3, 5)) + "  per extra row at w=0")
for rows in row_counts:
    costs = [statistics.median(seconds[(rows, n)]) / decode for n in (1, 2, 3, 5)]
    print(f"{rows:4d} " + "".join(f"  {c:7.2f}" for c in costs) + f"  {(costs[0] - 1) / max(rows - 1, 1):7.3f}")
