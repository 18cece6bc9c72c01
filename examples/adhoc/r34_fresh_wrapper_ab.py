"""Round 34 (the AMD EPYC, one thread): the useless-drafts row "fresh SelfSpecModel per call" (SmolLM2's shipped
Medusa heads, a new wrapper for every call, as `selfspec generate` builds one) against the same heads in one wrapper
kept across calls and against speculation off, greedy, 128 tokens without EOS, the benchmark's first 2 held-out chat
prompts, ROUNDS rounds interleaved; per pair: tokens per second over speculation off's; medians, and what each drafted.
Usage: PYTHONPATH=examples/adhoc python examples/adhoc/r34_fresh_wrapper_ab.py ROUNDS"""
import statistics
import sys
import time

import torch
import transformers

from selfspec.engine import SelfSpecModel
from harness import interleaved, smollm2_chat  # examples/adhoc/harness.py

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
model, tokenizer, prompts = smollm2_chat(2, 128)
HEADS = "examples/smollm2/heads"
kept = SelfSpecModel(model, heads=HEADS, tokenizer=tokenizer)
off = SelfSpecModel(model, drafter="none", tokenizer=tokenizer)
build = {"off": lambda: off, "kept wrapper": lambda: kept,
         "fresh wrapper": lambda: SelfSpecModel(model, heads=HEADS, tokenizer=tokenizer)}


def run(name, prompt):
    started = time.perf_counter()
    out = build[name]().generate(prompt, max_new_tokens=128, eos_token_id=[])
    return 128 / (time.perf_counter() - started), out.stats


for name in build:  # warm-up
    run(name, prompts[0][:, -32:])
ratios, drafted, tpf = ({name: [] for name in build if name != "off"} for _ in range(3))
for results in interleaved(list(build), prompts, int(sys.argv[1]), run):
    for name in ratios:
        ratios[name].append(results[name][0] / results["off"][0])
        drafted[name].append(results[name][1].drafted)
        tpf[name].append(results[name][1].tokens_per_forward)
for name, values in ratios.items():
    print(f"{name:14s} {statistics.median(values):.3f}x of speculation off (pairs {min(values):.2f}-"
          f"{max(values):.2f}), {statistics.mean(drafted[name]):.0f} drafted a call, "
          f"{statistics.mean(tpf[name]):.3f} tokens per forward")
