"""Round 25 (Intel Xeon with AMX, one thread): greedy argmax through `sampling.blocked_argmax` against torch's CPU
argmax, interleaved in one process ("torch argmax" patches `blocked_argmax` back to `argmax`, and the batch's one
argmax for all rows back to each row's own). Part 1: SmolLM2 with its EAGLE head at the default settings (a tree of
10 here), greedy, PROMPTS held-out chat prompts x 128 tokens, ROUNDS rounds, against plain `generate`. Part 2: the
reference model's batch of 8 code prompts, 96 tokens without EOS, k = 0 and "auto", ROUNDS rounds.
Usage: python examples/adhoc/r25_argmax_ab.py ROUNDS [PROMPTS]"""
import collections
import contextlib
import statistics
import sys
import time

import torch
import transformers
from harness import greedy_against_generate, interleaved, reference_batch, smollm2_chat

import selfspec.batch
import selfspec.sampling
from selfspec.engine import SelfSpecModel

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
rounds = int(sys.argv[1])
num_prompts = int(sys.argv[2]) if len(sys.argv) > 2 else 3
blocked, greedy_rows = selfspec.sampling.blocked_argmax, selfspec.batch._greedy_rows


@contextlib.contextmanager
def torch_argmax():
    selfspec.sampling.blocked_argmax = lambda scores, block=0: scores.argmax(dim=-1)
    selfspec.batch._greedy_rows = lambda logits, sizes: [None] * len(sizes)
    try:
        yield
    finally:
        selfspec.sampling.blocked_argmax, selfspec.batch._greedy_rows = blocked, greedy_rows


class Patched:
    """A SelfSpecModel whose generate runs under torch's argmax."""

    def __init__(self, spec):
        self.spec = spec

    def generate(self, *args, **kwargs):
        with torch_argmax():
            return self.spec.generate(*args, **kwargs)


model, tokenizer, prompts = smollm2_chat(num_prompts, 128)
spec = SelfSpecModel(model, heads="examples/smollm2/eagle", tokenizer=tokenizer)
print(f"SmolLM2: tree_size {spec.tree_size}", flush=True)
greedy_against_generate(model, tokenizer, {"blocked argmax": spec, "torch argmax": Patched(spec)}, prompts, rounds,
                        128)

spec, batch = reference_batch(8)
kw = dict(max_new_tokens=96, eos_token_id=[])
spec.generate([p[-16:] for p in batch[:2]], **kw)  # warm-up
variants = {"blocked k0": 0, "torch k0": 0, "blocked auto": "auto", "torch auto": "auto"}
seconds, sequences = collections.defaultdict(list), {}


def run(name, _):
    with torch_argmax() if name.startswith("torch") else contextlib.nullcontext():
        started = time.perf_counter()
        out = spec.generate(batch, num_draft_tokens=variants[name], **kw)
        seconds[name].append(time.perf_counter() - started)
    sequences.setdefault(name, [s.tolist() for s in out.sequences])


for _ in interleaved(list(variants), [None], rounds, run):
    pass
for name in variants:
    print(f"reference batch 8 {name}: median {statistics.median(seconds[name]):.3f}s, "
          f"same rows as torch k0: {sequences[name] == sequences['torch k0']}")
for kind in ("k0", "auto"):
    ratio = statistics.median(seconds["torch " + kind]) / statistics.median(seconds["blocked " + kind])
    print(f"{kind}: torch / blocked {ratio:.3f}x")
