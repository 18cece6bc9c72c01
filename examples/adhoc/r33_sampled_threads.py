"""Round 33 (the AMD EPYC, 2 vCPUs): the two-thread main table's sampled rows that read below speculation off
(ratios of two rounds' medians: the shipped Medusa heads 0.89x, early exit at layer 8 0.92x), paired and interleaved
with speculation off at THREADS torch threads: SmolLM2, T=0.7, top-p 0.9, 128 tokens without EOS, one wrapper each
at its defaults; prints each call's drafted tokens and shadow probes and the paired median ratio.
Usage: PYTHONPATH=examples/adhoc python examples/adhoc/r33_sampled_threads.py THREADS ROUNDS"""
import statistics
import sys

import torch
import transformers

from selfspec.engine import SelfSpecModel
from harness import interleaved, smollm2_chat, timed_call  # examples/adhoc/harness.py

threads, rounds = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
transformers.logging.set_verbosity_error()
model, tokenizer, prompts = smollm2_chat(2, 128)
specs = {"off": SelfSpecModel(model, drafter="none"),
         "medusa": SelfSpecModel(model, heads="examples/smollm2/heads"),
         "early exit": SelfSpecModel(model, drafter="early_exit", exit_layer=8)}
kwargs = dict(max_new_tokens=128, do_sample=True, temperature=0.7, top_p=0.9, eos_token_id=[])


def run(name, prompt):
    return timed_call(model, tokenizer, specs[name], prompt, **kwargs)


variants = list(specs)
for name in variants:
    run(name, prompts[0][:, -32:])
ratios = {name: [] for name in variants[1:]}
for results in interleaved(variants, prompts, rounds, run):
    for name in variants[1:]:
        stats = results[name].stats
        ratios[name].append(results["off"].seconds / results[name].seconds)
        print(f"{name}: {ratios[name][-1]:.3f}x of off  drafted {stats.drafted} accepted {stats.accepted} "
              f"forwards {stats.target_forwards} probed {stats.probed}", flush=True)
print(f"{torch.get_num_threads()} torch threads")
for name, values in ratios.items():
    print(f"{name}: median {statistics.median(values):.3f}x of speculation off ({min(values):.2f}-{max(values):.2f})")
