"""Round 31 (an AMD EPYC with AVX-512, one thread): where the reference model's random (untrained) EAGLE head loses
time against speculation off although it drafts nothing (the benchmark's useless-drafts row it missed in rounds 24
and 30: 0.93x / 0.95x of off, greedy). Variants, paired and interleaved in a random order per prompt and round, 96
tokens without EOS, greedy (or sampled at T=0.7, top-p 0.9), on the benchmark's 4 held-out code prompts: speculation
off, the random head at its defaults (trees "auto"), and the same head as chains (tree_size=None). Counts the
drafter's proposals (steps that asked it) and the time spent in them, so the loss can be split into proposing and
the rest.
Usage: PYTHONPATH=examples/adhoc python examples/adhoc/r31_random_eagle.py ROUNDS [sampled]"""
import statistics
import sys
import time

import torch
import transformers

from selfspec.bench.methods import random_eagle_head
from selfspec.bench.prompts import prompt_ids, prompt_texts
from selfspec.engine import SelfSpecModel
from selfspec.loading import load_model, load_tokenizer
from harness import REFERENCE, interleaved, timed_call  # examples/adhoc/harness.py

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
model, tokenizer = load_model(REFERENCE), load_tokenizer(REFERENCE)
kind, texts = prompt_texts(tokenizer, 4)
prompts = prompt_ids(tokenizer, texts, kind, 8192, 96, "cpu")
noise = random_eagle_head(model, seed=3)
specs = {"off": SelfSpecModel(model, drafter="none"), "eagle trees": SelfSpecModel(model, heads=noise),
         "eagle chains": SelfSpecModel(model, heads=noise, tree_size=None)}
proposals = {name: [0, 0.0] for name in specs}  # [calls, seconds] of drafter.propose, per variant


def counted(name, propose):
    def wrapper(context):
        started = time.perf_counter()
        try:
            return propose(context)
        finally:
            proposals[name][0] += 1
            proposals[name][1] += time.perf_counter() - started
    return wrapper


for name, spec in specs.items():
    if name != "off":
        spec.drafter.propose = counted(name, spec.drafter.propose)
sampled = len(sys.argv) > 2 and sys.argv[2] == "sampled"  # T=0.7, top-p 0.9, as the benchmark samples
kwargs = dict(max_new_tokens=96, eos_token_id=[],
              **(dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=0) if sampled else dict(do_sample=False)))
variants = ["generate", *specs]
for name in variants:  # warm-up
    timed_call(model, tokenizer, specs.get(name), prompts[0][:, -32:], **kwargs)
for counts in proposals.values():
    counts[:] = [0, 0.0]
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
results = list(interleaved(variants, prompts, rounds,
                           lambda n, p: timed_call(model, tokenizer, specs.get(n), p, **kwargs)))
runs = len(results)
for name in variants[1:]:
    to_off = [r["off"].seconds / r[name].seconds for r in results]
    to_generate = [r["generate"].seconds / r[name].seconds for r in results]
    seconds = statistics.mean(r[name].seconds for r in results)
    calls, propose_seconds = proposals.get(name, [0, 0.0])
    print(f"{name:13s} vs off {statistics.median(to_off):.3f}x ({min(to_off):.2f}-{max(to_off):.2f})  vs generate "
          f"{statistics.median(to_generate):.3f}x  per call: {seconds * 1e3:.0f} ms, {calls / runs:.1f} proposals "
          f"taking {propose_seconds / runs * 1e3:.1f} ms, "
          f"drafted {statistics.mean(r[name].stats.drafted for r in results):.1f}, "
          f"probed {statistics.mean(r[name].stats.probed for r in results):.1f}")
