"""Round 20 (Intel Xeon with AVX-512, one thread): SmolLM2 with its EAGLE head, greedy, held-out chat prompts: plain
generate vs the chain and a tree of N nodes with "auto", each with the draft-length policy's unseen positions aging
(`AdaptiveDraftLength(stale_decay=S)`) and without (S = 1, the policy before round 20), interleaved in a random order
per round, with the user's cache directory (the kept cost curves, as the benchmarks run). Prints the median speedup
over generate, tokens per forward, the mean depth "auto" asked for, and whether every run's tokens equal generate's.
Usage: python examples/adhoc/r20_stale_ab.py ROUNDS NUM_PROMPTS MAX_NEW_TOKENS [N [S]]"""
import functools
import random
import statistics
import sys

import torch
import transformers

import selfspec.draft_length as dl
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_ids, prompt_texts
from selfspec.bench.settings import parse_args
from selfspec.engine import SelfSpecModel
from harness import timed_call  # examples/adhoc/harness.py

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
rounds, num_prompts, max_new = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
tree_size = int(sys.argv[4]) if len(sys.argv) > 4 else 10
stale = float(sys.argv[5]) if len(sys.argv) > 5 else 0.95

loaded = load(parse_args(["--model", "smollm2", "--heads", "none", "--eagle", "examples/smollm2/eagle"]), [])
model, tokenizer = loaded.model, loaded.tokenizer
kind, texts = prompt_texts(tokenizer, num_prompts)
prompts = prompt_ids(tokenizer, texts, kind, 2048, max_new, "cpu")
specs = {f"{name} stale={s}": (SelfSpecModel(model, "eagle", heads="examples/smollm2/eagle", tokenizer=tokenizer,
                                             tree_size=n), s)
         for name, n in [("chain", None), (f"tree {tree_size}", tree_size)] for s in (1.0, stale)}
variants = ["generate", *specs]
kw = dict(max_new_tokens=max_new, do_sample=False, eos_token_id=[])
adaptive = dl.AdaptiveDraftLength
asked = []


class Traced(adaptive):
    def choose(self):
        asked.append(super().choose())
        return asked[-1]


def run(name, prompt):
    spec, s = specs.get(name, (None, 1.0))
    dl.AdaptiveDraftLength = functools.partial(Traced, stale_decay=s)  # what draft_length_policy builds for "auto"
    asked.clear()
    result = timed_call(model, tokenizer, spec, prompt, **kw)
    return (*result, statistics.mean(asked) if asked else 0.0)


for name in specs:
    run(name, prompts[0][:, -32:])  # warm-up
speedups, tpf, identical, depth = ({v: [] for v in variants} for _ in range(4))
order = random.Random(0)
for _ in range(rounds):
    for prompt in prompts:
        results = {}
        for name in order.sample(variants, len(variants)):
            results[name] = run(name, prompt)
        for name in variants:
            speedups[name].append(results["generate"][0] / results[name][0])
            tpf[name].append(results[name][1])
            identical[name].append(results[name][2] == results["generate"][2])
            depth[name].append(results[name][3])
        print(" ".join(f"{name}: {speedups[name][-1]:.2f}x {tpf[name][-1]:.2f}" for name in specs), flush=True)
print(f"{rounds} rounds x {len(prompts)} prompts, {max_new} new tokens; medians of per-run ratios to generate")
for name in variants:
    print(f"{name:24s} {statistics.median(speedups[name]):.3f}x (mean {statistics.mean(speedups[name]):.3f}x)  "
          f"tokens/forward {statistics.mean(tpf[name]):.2f}  mean k asked {statistics.mean(depth[name]):.2f}  "
          f"identical {sum(identical[name])}/{len(identical[name])}")
