"""Round 15 (AMD EPYC, one thread): SmolLM2 with its EAGLE head, greedy, held-out chat prompts: plain generate vs the
chain ("auto") and trees of N nodes, each with round 14's few-row kernel (fetching the next weights only during the
first pass over x's rows, two rows at a time; built from git) and with this round's (three rows at a time, K in
slices, the next weights fetched during every pass), interleaved in a random order per round; a fresh cache
directory, so every wrapper starts from the prior cost curve. Prints the median speedup over generate, tokens per
forward, and whether every run's tokens equal generate's.
Usage: python examples/adhoc/r15_kernel_ab.py ROUNDS NUM_PROMPTS MAX_NEW_TOKENS [N ...]"""
import ctypes
import os
import random
import statistics
import subprocess
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
sizes = [int(n) for n in sys.argv[4:]] or [6]
old_source = os.path.join(os.environ["SELFSPEC_CACHE_DIR"], "old.c")
with open(old_source, "w") as f:
    f.write(subprocess.run(["git", "show", "771f098:selfspec/kernels/few_row_linear.c"], capture_output=True,
                           text=True, check=True).stdout)
subprocess.run(["cc", *frl.FLAGS, old_source, "-o", old_source[:-2] + ".so"], check=True)
old_kernel = ctypes.CDLL(old_source[:-2] + ".so").few_row_linear
old_kernel.argtypes, old_kernel.restype = frl._load()[0].argtypes, None

loaded = load(parse_args(["--model", "smollm2", "--heads", "none", "--eagle", "examples/smollm2/eagle"]), [])
model, tokenizer = loaded.model, loaded.tokenizer
kind, texts = prompt_texts(tokenizer, num_prompts)
prompts = prompt_ids(tokenizer, texts, kind, 2048, max_new, "cpu")
heads = "examples/smollm2/eagle"
specs = {}
for n in [None, *sizes]:
    name = "chain" if n is None else f"tree {n}"
    specs[f"{name} new"] = SelfSpecModel(model, "eagle", heads=heads, tokenizer=tokenizer, tree_size=n)
    new_load = frl._load
    frl._load = lambda: (old_kernel, None)  # the wrapper's layers take round 14's kernel
    try:
        specs[f"{name} old"] = SelfSpecModel(model, "eagle", heads=heads, tokenizer=tokenizer, tree_size=n)
    finally:
        frl._load = new_load
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
