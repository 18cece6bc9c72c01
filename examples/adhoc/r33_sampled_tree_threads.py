"""Round 33: round 25's sampled tree / chain A/B at THREADS torch threads (the few-row kernel splits its products
between them since round 33). Round 25 (Intel Xeon with AMX, one thread): SmolLM2 with its EAGLE head, sampled
(T=0.7, top-p 0.9): the default tree of 10 against the chain (`tree_size=None`) and plain `generate`, PROMPTS
held-out chat prompts x 128 tokens, ROUNDS rounds, interleaved; tokens per second per call (sampled calls end at EOS
at different lengths, so seconds per call are not comparable), medians, and the chain / tree ratio per (round,
prompt).
Usage: PYTHONPATH=examples/adhoc python examples/adhoc/r33_sampled_tree_threads.py THREADS ROUNDS [PROMPTS]"""
import collections
import statistics
import sys

import torch
import transformers
from harness import interleaved, smollm2_chat, timed_call

from selfspec.engine import SelfSpecModel

torch.set_num_threads(int(sys.argv[1]))
transformers.logging.set_verbosity_error()
rounds = int(sys.argv[2])
model, tokenizer, prompts = smollm2_chat(int(sys.argv[3]) if len(sys.argv) > 3 else 3, 128)
specs = {"tree 10": SelfSpecModel(model, heads="examples/smollm2/eagle", tokenizer=tokenizer),
         "chain": SelfSpecModel(model, heads="examples/smollm2/eagle", tokenizer=tokenizer, tree_size=None)}
assert specs["tree 10"].tree_size == 10, specs["tree 10"].tree_size
kw = dict(max_new_tokens=128, do_sample=True, temperature=0.7, top_p=0.9)
for spec in specs.values():
    spec.generate(prompts[0][0], max_new_tokens=16, do_sample=True)  # warm-up
rates, tpf = collections.defaultdict(list), collections.defaultdict(list)


def run(name, prompt):
    timed = timed_call(model, tokenizer, specs.get(name), prompt, **kw)
    rates[name].append(len(timed.new_tokens) / timed.seconds)
    tpf[name].append(timed.tokens_per_forward)
    return timed


for _ in interleaved(["generate", "tree 10", "chain"], prompts, rounds, run):
    print({name: f"{values[-1]:.1f} tok/s" for name, values in rates.items()}, flush=True)
for name in ("tree 10", "chain"):
    speedup = statistics.median(a / b for a, b in zip(rates[name], rates["generate"]))
    print(f"{name}: median {speedup:.3f}x of generate's tokens/s, tokens per forward {statistics.mean(tpf[name]):.2f}")
ratio = statistics.median(a / b for a, b in zip(rates["chain"], rates["tree 10"]))
print(f"chain / tree tokens per second, median per pair: {ratio:.3f}x")
