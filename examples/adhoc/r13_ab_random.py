"""SmolLM2, the random drafter (useless drafts), greedy, held-out chat prompts: speculation off vs "auto" with the
few-row kernel on and off, interleaved in a random order per round; median ratio to speculation off, drafts per call,
and the learned verify cost of 1 and 2 drafts at the end. Round 13 asks whether the kernel made useless drafts cost
more (the useless-drafts benchmark's random-drafts row fell to 0.90x of speculation off).
Usage: python examples/adhoc/r13_ab_random.py ROUNDS [NUM_PROMPTS] [MAX_NEW_TOKENS]"""
import random
import statistics
import sys
import time

import torch
import transformers

from selfspec.bench.methods import RandomDrafter
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_ids, prompt_texts
from selfspec.bench.settings import parse_args
from selfspec.engine import SelfSpecModel

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
num_prompts = int(sys.argv[2]) if len(sys.argv) > 2 else 2
max_new = int(sys.argv[3]) if len(sys.argv) > 3 else 128
loaded = load(parse_args(["--model", "smollm2", "--heads", "none", "--eagle", "none"]), [])
model, tokenizer = loaded.model, loaded.tokenizer
kind, texts = prompt_texts(tokenizer, num_prompts)
prompts = prompt_ids(tokenizer, texts, kind, 2048, max_new, "cpu")
vocab = model.config.vocab_size
specs = {"off": SelfSpecModel(model, drafter="none"),
         "kernel on": SelfSpecModel(model, drafter=RandomDrafter(vocab)),
         "kernel off": SelfSpecModel(model, drafter=RandomDrafter(vocab), few_row_kernel="off")}
kw = dict(max_new_tokens=max_new, do_sample=False, eos_token_id=[])
for spec in specs.values():
    spec.generate(prompts[0][0][-32:], max_new_tokens=32, eos_token_id=[])  # warm-up
seconds, drafted, rng = {n: [] for n in specs}, {n: [] for n in specs}, random.Random(0)
for _ in range(rounds):
    for prompt in prompts:
        order = list(specs)
        rng.shuffle(order)
        for name in order:
            started = time.perf_counter()
            out = specs[name].generate(prompt[0], **kw)
            seconds[name].append(time.perf_counter() - started)
            drafted[name].append(out.stats.drafted)
for name in specs:
    ratios = [o / t for o, t in zip(seconds["off"], seconds[name])]
    curve = specs[name].verify_cost().relative if name != "off" else ()
    print(f"{name:10s} {statistics.median(ratios):.3f}x of speculation off ({min(ratios):.2f}-{max(ratios):.2f}), "
          f"drafts per call {statistics.median(drafted[name])}, learned verify cost k=1/2: "
          f"{' / '.join(f'{c:.2f}' for c in curve[1:3])}")
