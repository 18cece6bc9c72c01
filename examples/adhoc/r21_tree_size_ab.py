"""Round 21 (AMD EPYC with AVX-512, one thread): SmolLM2 with its EAGLE head, greedy, held-out chat prompts: plain
generate vs the chain ("auto" draft length) vs trees of N nodes each keeping only nodes whose cumulative draft
probability exceeds a floor (`SelfSpecModel.min_node_probability`; "auto" trees on a CPU with the kernel are 10:0.02),
interleaved in a random order per round, with the user's cache directory. Prints the median speedup over generate,
tokens per forward, nodes verified per step, and whether every run's tokens equal generate's.
Usage: python examples/adhoc/r21_tree_size_ab.py ROUNDS NUM_PROMPTS MAX_NEW_TOKENS VARIANT [VARIANT ...]
where a VARIANT is "chain" or N:FLOOR (e.g. 10:0.02)."""
import statistics
import sys

import torch
import transformers

from selfspec.engine import SelfSpecModel
from harness import interleaved, smollm2_chat, timed_call  # examples/adhoc/harness.py

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
rounds, num_prompts, max_new = (int(a) for a in sys.argv[1:4])

model, tokenizer, prompts = smollm2_chat(num_prompts, max_new)
specs = {}
for variant in sys.argv[4:]:
    size, _, floor = variant.partition(":")
    specs[variant] = SelfSpecModel(model, "eagle", heads="examples/smollm2/eagle", tokenizer=tokenizer,
                                   tree_size=None if size == "chain" else int(size))
    specs[variant].min_node_probability = float(floor or 0.0)
variants = ["generate", *specs]
kw = dict(max_new_tokens=max_new, do_sample=False, eos_token_id=[])


def run(name, prompt):
    return timed_call(model, tokenizer, specs.get(name), prompt, **kw)


for name in specs:
    run(name, prompts[0][:, -32:])  # warm-up
speedups, tpf, nodes, identical = ({v: [] for v in variants} for _ in range(4))
for results in interleaved(variants, prompts, rounds, run):
    plain = results["generate"]
    for name in variants:
        timed, stats = results[name], results[name].stats
        speedups[name].append(plain.seconds / timed.seconds)
        tpf[name].append(timed.tokens_per_forward)
        nodes[name].append(stats.drafted / max(stats.target_forwards - 1, 1) if stats else 0.0)
        identical[name].append(timed.new_tokens == plain.new_tokens)
    print(" ".join(f"{name}: {speedups[name][-1]:.2f}x {tpf[name][-1]:.2f}" for name in specs), flush=True)
print(f"{rounds} rounds x {len(prompts)} prompts, {max_new} new tokens; medians of per-run ratios to generate")
for name in variants:
    print(f"{name:10s} {statistics.median(speedups[name]):.3f}x (mean {statistics.mean(speedups[name]):.3f}x)  "
          f"tokens/forward {statistics.mean(tpf[name]):.2f}  drafted per step {statistics.mean(nodes[name]):.2f}  "
          f"identical {sum(identical[name])}/{len(identical[name])}")
