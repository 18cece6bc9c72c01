"""Round 20 (Intel Xeon with AVX-512, one thread): SmolLM2 with its EAGLE head, greedy, held-out chat prompts: plain
generate vs the chain and a tree of N nodes with "auto", each with the draft-length policy's unseen positions aging
(`AdaptiveDraftLength(stale_decay=S)`) and without (S = 1, the policy before round 20), interleaved in a random order
per round, with the user's cache directory (the kept cost curves, as the benchmarks run). Prints the median speedup
over generate, tokens per forward, the mean depth "auto" asked for, and whether every run's tokens equal generate's.
Usage: python examples/adhoc/r20_stale_ab.py ROUNDS NUM_PROMPTS MAX_NEW_TOKENS [N [S]]"""
import functools
import statistics
import sys

import torch
import transformers

import selfspec.draft_length as dl
from selfspec.engine import SelfSpecModel
from harness import interleaved, smollm2_chat, timed_call  # examples/adhoc/harness.py

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
rounds, num_prompts, max_new = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
tree_size = int(sys.argv[4]) if len(sys.argv) > 4 else 10
stale = float(sys.argv[5]) if len(sys.argv) > 5 else 0.95

model, tokenizer, prompts = smollm2_chat(num_prompts, max_new)
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
    return timed_call(model, tokenizer, spec, prompt, **kw), statistics.mean(asked) if asked else 0.0


for name in specs:
    run(name, prompts[0][:, -32:])  # warm-up
speedups, tpf, identical, depth = ({v: [] for v in variants} for _ in range(4))
for results in interleaved(variants, prompts, rounds, run):
    for name in variants:
        (timed, mean_asked), plain = results[name], results["generate"][0]
        speedups[name].append(plain.seconds / timed.seconds)
        tpf[name].append(timed.tokens_per_forward)
        identical[name].append(timed.new_tokens == plain.new_tokens)
        depth[name].append(mean_asked)
    print(" ".join(f"{name}: {speedups[name][-1]:.2f}x {tpf[name][-1]:.2f}" for name in specs), flush=True)
print(f"{rounds} rounds x {len(prompts)} prompts, {max_new} new tokens; medians of per-run ratios to generate")
for name in variants:
    print(f"{name:24s} {statistics.median(speedups[name]):.3f}x (mean {statistics.mean(speedups[name]):.3f}x)  "
          f"tokens/forward {statistics.mean(tpf[name]):.2f}  mean k asked {statistics.mean(depth[name]):.2f}  "
          f"identical {sum(identical[name])}/{len(identical[name])}")
