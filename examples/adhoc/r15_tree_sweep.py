"""Round 15 (AMD EPYC, one thread, this round's few-row kernel): SmolLM2 with its EAGLE head, held-out chat prompts:
plain generate vs the chain ("auto") vs trees of each size N (tree_size=N, "auto" draft length), greedy or sampled
(T=0.7, top-p 0.9, unseeded: speed only), interleaved in a random order per round; median speedup over generate,
tokens per forward, and (greedy) whether every run's tokens equal generate's.
Usage: python examples/adhoc/r15_tree_sweep.py ROUNDS NUM_PROMPTS MAX_NEW_TOKENS greedy|sampled N [N ...]
A size may name the drafter's tree_top_k too, N:K (round 16; default 4)."""
import random
import statistics
import sys
import time

import torch
import transformers

from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_ids, prompt_texts
from selfspec.bench.settings import parse_args
from selfspec.engine import SelfSpecModel

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
rounds, num_prompts, max_new, mode = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
sizes = sys.argv[5:] or ["6", "10", "16"]
loaded = load(parse_args(["--model", "smollm2", "--heads", "none", "--eagle", "examples/smollm2/eagle"]), [])
model, tokenizer = loaded.model, loaded.tokenizer
kind, texts = prompt_texts(tokenizer, num_prompts)
prompts = prompt_ids(tokenizer, texts, kind, 2048, max_new, "cpu")
heads = "examples/smollm2/eagle"
specs = {"chain": SelfSpecModel(model, "eagle", heads=heads, tokenizer=tokenizer)}
for size in sizes:
    n, _, top_k = size.partition(":")
    options = dict(tree_top_k=int(top_k)) if top_k else {}
    specs[f"tree {size}"] = SelfSpecModel(model, "eagle", heads=heads, tokenizer=tokenizer, tree_size=int(n), **options)
variants = ["generate", *specs]
sampling = dict(do_sample=True, temperature=0.7, top_p=0.9) if mode == "sampled" else dict(do_sample=False)
kw = dict(max_new_tokens=max_new, eos_token_id=[], **sampling)


def run(name, prompt):
    started = time.perf_counter()
    if name == "generate":
        extra = dict(top_k=0) if mode == "sampled" else {}  # (no implicit top-k, as the benchmark)
        out = model.generate(prompt, pad_token_id=tokenizer.eos_token_id, attention_mask=torch.ones_like(prompt),
                             **extra, **kw)
        return time.perf_counter() - started, 1.0, out[0, prompt.shape[1]:].tolist()
    out = specs[name].generate(prompt[0], **kw)
    return time.perf_counter() - started, out.stats.tokens_per_forward, out.sequences[0, prompt.shape[1]:].tolist()


for spec in specs.values():
    spec.generate(prompts[0][0][-32:], max_new_tokens=32, eos_token_id=[])  # warm-up
ratios, per_forward, same = {v: [] for v in variants}, {v: [] for v in variants}, {v: 0 for v in variants}
rng = random.Random(0)
for _ in range(rounds):
    for prompt in prompts:
        order = list(variants)
        rng.shuffle(order)
        results = {name: run(name, prompt) for name in order}
        for name, (seconds, tpf, tokens) in results.items():
            ratios[name].append(results["generate"][0] / seconds)
            per_forward[name].append(tpf)
            same[name] += tokens == results["generate"][2]
for name in variants:
    r = ratios[name]
    identical = f", identical to generate {same[name]}/{len(r)}" if mode == "greedy" else ""
    print(f"{name:10s} {statistics.median(r):.2f}x of generate ({min(r):.2f}-{max(r):.2f}), "
          f"{statistics.median(per_forward[name]):.2f} tokens per forward{identical}")
