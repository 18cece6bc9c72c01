"""Round 17 (AMD EPYC, one thread): paired A/B of the few-row kernel's routing wrapper. Round 17 made the per-call
forward leaner (inline checks, parameters read from the module's dict, no copy of a contiguous input); round 16's
forward (kept below as it was) read `layer.weight` through nn.Module's attribute lookup and checked through helpers.
SmolLM2 with its EAGLE head, held-out chat prompts, greedy; interleaved in a random order per round: generate vs
each variant (a chain and a tree of N), wrapper round 17 vs round 16. Median speedup over generate, tokens per forward,
identical tokens.
Usage: python examples/adhoc/r17_wrapper_ab.py ROUNDS NUM_PROMPTS MAX_NEW_TOKENS N"""
import random
import statistics
import sys
import time
from collections import defaultdict

import torch
import torch.nn.functional as F
import transformers

from selfspec import few_row_linear as frl
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_ids, prompt_texts
from selfspec.bench.settings import parse_args
from selfspec.engine import SelfSpecModel

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
rounds, num_prompts, max_new, tree_size = (int(a) for a in sys.argv[1:5])
loaded = load(parse_args(["--model", "smollm2", "--heads", "none", "--eagle", "examples/smollm2/eagle"]), [])
model, tokenizer = loaded.model, loaded.tokenizer
kind, texts = prompt_texts(tokenizer, num_prompts)
prompts = prompt_ids(tokenizer, texts, kind, 2048, max_new, "cpu")
heads = "examples/smollm2/eagle"


def round16_forward(layer, kernel):
    k_dim, n_dim = layer.in_features, layer.out_features

    def forward(x):
        weight, bias = layer.weight, layer.bias
        if (not frl.MIN_ROWS <= x.numel() // k_dim <= frl.MAX_ROWS or x.shape[-1] != k_dim
                or not frl._plain_float32(x) or weight.shape != (n_dim, k_dim)
                or not frl._dense_parameters(weight, bias)
                or torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
            return F.linear(x, weight, bias)
        rows_in = x.reshape(-1, x.shape[-1]).contiguous()
        out = x.new_empty(x.shape[:-1] + (weight.shape[0],))
        kernel(rows_in.data_ptr(), rows_in.shape[0], rows_in.shape[1], weight.data_ptr(), weight.shape[0],
               None if bias is None else bias.data_ptr(), out.data_ptr())
        return out
    return forward


specs = {}
for label, size in (("chain", None), (f"tree of {tree_size}", tree_size)):
    specs[f"{label}, round 17"] = SelfSpecModel(model, "eagle", heads=heads, tokenizer=tokenizer, tree_size=size)
    old = SelfSpecModel(model, "eagle", heads=heads, tokenizer=tokenizer, tree_size=size)
    kernel = frl._load()[0]
    old.few_row_linears.forwards = [(layer, round16_forward(layer, kernel))
                                    for layer, _ in old.few_row_linears.forwards]
    specs[f"{label}, round 16"] = old
kw = dict(max_new_tokens=max_new, eos_token_id=[], do_sample=False)


def run(name, prompt):
    started = time.perf_counter()
    if name == "generate":
        out = model.generate(prompt, pad_token_id=tokenizer.eos_token_id, attention_mask=torch.ones_like(prompt), **kw)
        return time.perf_counter() - started, 1.0, out[0, prompt.shape[1]:].tolist()
    out = specs[name].generate(prompt[0], **kw)
    return time.perf_counter() - started, out.stats.tokens_per_forward, out.sequences[0, prompt.shape[1]:].tolist()


for spec in specs.values():
    spec.generate(prompts[0][0][-32:], max_new_tokens=32, eos_token_id=[])  # warm-up
variants = ["generate", *specs]
ratios, per_forward, same = defaultdict(list), defaultdict(list), defaultdict(int)
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
print(f"{rounds} rounds x {len(prompts)} prompts, {max_new} tokens, greedy")
for name in variants:
    r = ratios[name]
    print(f"  {name:22s} {statistics.median(r):.3f}x of generate ({min(r):.2f}-{max(r):.2f}), "
          f"{statistics.median(per_forward[name]):.2f} tokens per forward, identical {same[name]}/{len(r)}")
for label in ("chain", f"tree of {tree_size}"):
    paired = [a / b for a, b in zip(ratios[f"{label}, round 17"], ratios[f"{label}, round 16"])]
    print(f"  {label}: round 17 / round 16 per run: median {statistics.median(paired):.3f} "
          f"({min(paired):.2f}-{max(paired):.2f})")
