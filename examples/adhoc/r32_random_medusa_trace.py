"""Round 32 (an AMD EPYC with AVX-512, one thread): SmolLM2's useless-drafts rows that round 32's benchmark missed,
random (untrained) Medusa heads shaped like the shipped ones (the benchmark's, seed 0 + 2) and a fresh wrapper per
call with the shipped heads, sampled at T=0.7, top-p 0.9, 128 tokens without EOS, paired and interleaved with
speculation off; prints each call's drafted tokens, verify steps that drafted, shadow probes, and the paired median
ratio to speculation off.
Usage: PYTHONPATH=examples/adhoc python examples/adhoc/r32_random_medusa_trace.py ROUNDS"""
import statistics
import sys

import torch
import transformers

from heads import MedusaHeads
from selfspec.bench.methods import random_heads
from selfspec.engine import SelfSpecModel
from harness import interleaved, smollm2_chat, timed_call  # examples/adhoc/harness.py

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
rounds = int(sys.argv[1])
model, tokenizer, prompts = smollm2_chat(2, 128)
shipped = MedusaHeads.from_pretrained("examples/smollm2/heads")
specs = {"off": SelfSpecModel(model, drafter="none"),
         "random medusa": SelfSpecModel(model, heads=random_heads(model, like=shipped, seed=2))}
kwargs = dict(max_new_tokens=128, do_sample=True, temperature=0.7, top_p=0.9, eos_token_id=[])


def run(name, prompt):
    spec = specs.get(name) or SelfSpecModel(model, heads="examples/smollm2/heads")  # "fresh medusa": built per call
    return timed_call(model, tokenizer, spec, prompt, **kwargs)


variants = ["off", "random medusa", "fresh medusa"]
for name in variants:
    run(name, prompts[0][:, -32:])
ratios = {name: [] for name in variants[1:]}
for results in interleaved(variants, prompts, rounds, run):
    for name in variants[1:]:
        stats = results[name].stats
        ratios[name].append(results["off"].seconds / results[name].seconds)
        print(f"{name}: {ratios[name][-1]:.3f}x of off  drafted {stats.drafted} accepted {stats.accepted} "
              f"forwards {stats.target_forwards} probed {stats.probed}", flush=True)
for name, values in ratios.items():
    print(f"{name}: median {statistics.median(values):.3f}x of speculation off ({min(values):.2f}-{max(values):.2f})")
