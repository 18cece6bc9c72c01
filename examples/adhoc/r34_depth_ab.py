"""Round 34 (the AMD EPYC): does "auto" pick the tree's depth well? SmolLM2 with its EAGLE head, the default tree
(10 nodes above the 0.02 floor on a CPU with the kernel) with "auto" choosing the depth each step against the same
tree at fixed depths, greedy and sampled (T=0.7, top-p 0.9), interleaved; prints per variant and mode the median
speedup over `generate` per pair, tokens per forward, nodes verified per step.
Usage: PYTHONPATH=examples/adhoc python examples/adhoc/r34_depth_ab.py THREADS ROUNDS NUM_PROMPTS DEPTH [DEPTH ...]"""
import statistics
import sys

import torch
import transformers

from selfspec.engine import SelfSpecModel
from harness import interleaved, smollm2_chat, timed_call  # examples/adhoc/harness.py

threads, rounds, num_prompts = (int(a) for a in sys.argv[1:4])
torch.set_num_threads(threads)
transformers.logging.set_verbosity_error()
model, tokenizer, prompts = smollm2_chat(num_prompts, 128)
spec = SelfSpecModel(model, heads="examples/smollm2/eagle", tokenizer=tokenizer)
assert spec.tree_size == 10 and spec.min_node_probability > 0
depths = {"auto": "auto", **{f"depth {d}": int(d) for d in sys.argv[4:]}}
MODES = {"greedy": dict(do_sample=False), "sampled": dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=0)}
variants = [f"{name}/{mode}" for name in ("generate", *depths) for mode in MODES]


def run(variant, prompt):
    name, mode = variant.split("/")
    if name == "generate":
        return timed_call(model, tokenizer, None, prompt, max_new_tokens=128, eos_token_id=[], **MODES[mode])
    return timed_call(model, tokenizer, spec, prompt, max_new_tokens=128, eos_token_id=[],
                      num_draft_tokens=depths[name], **MODES[mode])


for v in variants:  # warm-up
    run(v, prompts[0][:, -32:])
speedups, tpf, nodes = ({v: [] for v in variants if not v.startswith("generate")} for _ in range(3))
for results in interleaved(variants, prompts, rounds, run):
    for v in speedups:
        plain, mine = results["generate/" + v.split("/")[1]], results[v]
        speedups[v].append((len(mine.new_tokens) / mine.seconds) / (len(plain.new_tokens) / plain.seconds))
        tpf[v].append(mine.tokens_per_forward)
        nodes[v].append(mine.stats.drafted / max(mine.stats.target_forwards - 1, 1))
for v in speedups:
    values = speedups[v]
    print(f"{v:16s} {statistics.median(values):.3f}x generate (pairs {min(values):.2f}-{max(values):.2f}), "
          f"{statistics.mean(tpf[v]):.2f} tokens per forward, {statistics.mean(nodes[v]):.1f} nodes a step")
