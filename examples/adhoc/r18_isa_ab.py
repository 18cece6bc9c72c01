"""Round 18 (Intel Xeon with AVX-512, one thread): SmolLM2 with its EAGLE head, greedy, held-out chat prompts: plain
generate vs the chain ("auto") and trees of N nodes, each with the few-row kernel built for AVX-512 (what "auto"
builds on this CPU) and for AVX2 + FMA (what it built before round 18), interleaved in a random order per round; a
fresh cache directory, so every wrapper starts from the prior cost curve. Prints the median speedup over generate,
tokens per forward, and whether every run's tokens equal generate's.
Usage: python examples/adhoc/r18_isa_ab.py ROUNDS NUM_PROMPTS MAX_NEW_TOKENS [N ...]"""
import os
import random
import statistics
import sys
import tempfile
import time

os.environ["SELFSPEC_CACHE_DIR"] = tempfile.mkdtemp()
import torch  # noqa: E402
import transformers  # noqa: E402

import selfspec.few_row_linear as frl  # noqa: E402
from selfspec.bench.models import load  # noqa: E402
from selfspec.bench.prompts import prompt_ids, prompt_texts  # noqa: E402
from selfspec.bench.settings import parse_args  # noqa: E402
from selfspec.engine import SelfSpecModel  # noqa: E402

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
rounds, num_prompts, max_new = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
sizes = [int(n) for n in sys.argv[4:]] or [10]
assert frl.kernel_isa() == "avx512", "this A/B needs a CPU with AVX-512"
avx2 = frl._load("avx2")

loaded = load(parse_args(["--model", "smollm2", "--heads", "none", "--eagle", "examples/smollm2/eagle"]), [])
model, tokenizer = loaded.model, loaded.tokenizer
kind, texts = prompt_texts(tokenizer, num_prompts)
prompts = prompt_ids(tokenizer, texts, kind, 2048, max_new, "cpu")
heads = "examples/smollm2/eagle"
specs = {}
for n in [None, *sizes]:
    name = "chain" if n is None else f"tree {n}"
    specs[f"{name} avx512"] = SelfSpecModel(model, "eagle", heads=heads, tokenizer=tokenizer, tree_size=n)
    avx512_load = frl._load
    frl._load = lambda: avx2  # the wrapper's layers take the AVX2 build
    try:
        specs[f"{name} avx2"] = SelfSpecModel(model, "eagle", heads=heads, tokenizer=tokenizer, tree_size=n)
    finally:
        frl._load = avx512_load
variants = ["generate", *specs]
kw = dict(max_new_tokens=max_new, do_sample=False, eos_token_id=[])


def run(name, prompt):
    started = time.perf_counter()
    if name == "generate":
        out = model.generate(prompt, pad_token_id=tokenizer.eos_token_id, attention_mask=torch.ones_like(prompt), **kw)
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
    print(f"{name:12s} {statistics.median(r):.2f}x of generate ({min(r):.2f}-{max(r):.2f}), "
          f"{statistics.median(per_forward[name]):.2f} tokens per forward, identical to generate {same[name]}/{len(r)}")
