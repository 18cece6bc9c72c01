"""Round 34 (the AMD EPYC): round 34's verify-cost curve ("new": a tree's curve sized to its node budget, untimed
prices ageing towards the fit, a kept curve loaded as its line plus remembered prices) against round 33's ("old": the
kept curve as the fit's start, k <= 8, no ageing), both starting from the curve the user's cache directory holds,
on SmolLM2 with its EAGLE head at the defaults (tree of 10 on this CPU), greedy and sampled (T=0.7, top-p 0.9),
interleaved in one process: two wrappers that differ only in the curve their "auto" plans with. Prints per variant
and mode the median speedup over `generate` per pair, tokens per forward, and the curve each ended with.
Usage: PYTHONPATH=examples/adhoc python examples/adhoc/r34_curve_ab.py THREADS ROUNDS NUM_PROMPTS"""
import statistics
import sys

import torch
import transformers

from selfspec import verify_cost
from selfspec.engine import SelfSpecModel
from harness import interleaved, smollm2_chat, timed_call  # examples/adhoc/harness.py

threads, rounds, num_prompts = (int(a) for a in sys.argv[1:4])
torch.set_num_threads(threads)
transformers.logging.set_verbosity_error()
model, tokenizer, prompts = smollm2_chat(num_prompts, 128)
specs = {name: SelfSpecModel(model, heads="examples/smollm2/eagle", tokenizer=tokenizer) for name in ("new", "old")}
new = specs["new"].verify_cost()  # round 34's, from the kept file (which it saves after each call)
kept = verify_cost._read_curve(new.path)
specs["old"]._verify_cost = verify_cost.LearnedVerifyCost(kept or verify_cost.prior_verify_cost(torch.device("cpu")),
                                                         None, stale_decay=1.0)  # round 33's, never saved
print(f"kept curve: {[round(c, 2) for c in kept.relative] if kept else None}, timed {kept.timed if kept else None}")
MODES = {"greedy": dict(do_sample=False), "sampled": dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=0)}
variants = [f"{name}/{mode}" for name in ("generate", *specs) for mode in MODES]


def run(variant, prompt):
    name, mode = variant.split("/")
    return timed_call(model, tokenizer, specs.get(name), prompt, max_new_tokens=128, eos_token_id=[], **MODES[mode])


for v in variants:  # warm-up
    run(v, prompts[0][:, -32:])
speedups, tpf = ({v: [] for v in variants if not v.startswith("generate")} for _ in range(2))
for results in interleaved(variants, prompts, rounds, run):
    for v in speedups:
        plain = results["generate/" + v.split("/")[1]]
        speedups[v].append((len(results[v].new_tokens) / results[v].seconds) / (len(plain.new_tokens) / plain.seconds))
        tpf[v].append(results[v].tokens_per_forward)
for v in speedups:
    values = speedups[v]
    print(f"{v:15s} {statistics.median(values):.3f}x generate (pairs {min(values):.2f}-{max(values):.2f}), "
          f"{statistics.mean(tpf[v]):.2f} tokens per forward")
for name, spec in specs.items():
    curve = spec.verify_cost()
    print(f"{name} curve at the end: {[round(curve(k), 2) for k in range(11)]}")
