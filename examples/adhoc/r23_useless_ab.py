"""Round 23 (AMD EPYC with AVX-512, one thread): the two SmolLM2 useless-drafts rows round 23's benchmark missed
(greedy, 128 tokens, the benchmark's 2 prompts): random (untrained) Medusa heads (the benchmark's, seed 0 + 2) with
their weights streamed in bfloat16 (`draft_dtype="auto"`, the default) and in float32 (`draft_dtype=None`), and early
exit at the untrained layer 8 (its drafting runs the model's own layers: no bfloat16 weights), against speculation off
and plain generate, paired and interleaved in a random order per prompt and round. Prints each variant's paired median
ratio to speculation off and to generate, and drafts / accepted per call.
Usage: python examples/adhoc/r23_useless_ab.py ROUNDS"""
import random
import statistics
import sys
import time

import torch
import transformers

from selfspec.bench.methods import random_heads
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_ids, prompt_texts
from selfspec.bench.settings import parse_args
from selfspec.engine import SelfSpecModel

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
loaded = load(parse_args(["--model", "smollm2", "--heads", "examples/smollm2/heads", "--eagle", "none"]), [])
model = loaded.model
kind, texts = prompt_texts(loaded.tokenizer, 2)
prompts = [p[0] for p in prompt_ids(loaded.tokenizer, texts, kind, 2048, 128, "cpu")]
noise = random_heads(model, like=loaded.heads, seed=2)
variants = {"off": SelfSpecModel(model, drafter="none"),
            "random medusa, bf16": SelfSpecModel(model, "medusa", heads=noise),
            "random medusa, fp32": SelfSpecModel(model, "medusa", heads=noise, draft_dtype=None),
            "early exit L=8": SelfSpecModel(model, "early_exit", exit_layer=8)}
assert variants["random medusa, bf16"].draft_dtype is torch.bfloat16
kw = dict(max_new_tokens=128, eos_token_id=[], do_sample=False)
for spec in variants.values():  # warm-up
    spec.generate(prompts[0][-32:], **{**kw, "max_new_tokens": 32})
model.generate(prompts[0][None, -32:], attention_mask=torch.ones_like(prompts[0][None, -32:]), max_new_tokens=32,
               do_sample=False, pad_token_id=loaded.pad_token_id)
names = ["generate", *variants]
rng, times, counts = random.Random(0), {k: [] for k in names}, {k: [] for k in variants}
for rnd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4):
    for prompt in prompts:
        order = list(names)
        rng.shuffle(order)
        for name in order:
            start = time.perf_counter()
            if name == "generate":
                model.generate(prompt[None], attention_mask=torch.ones_like(prompt[None]), max_new_tokens=128,
                               min_new_tokens=128, do_sample=False, pad_token_id=loaded.pad_token_id)
            else:
                out = variants[name].generate(prompt, **kw)
                counts[name].append((out.stats.drafted, out.stats.accepted))
            times[name].append(time.perf_counter() - start)
for name in variants:
    to_off = [o / t for o, t in zip(times["off"], times[name])]
    to_generate = [g / t for g, t in zip(times["generate"], times[name])]
    print(f"{name:22s} vs off {statistics.median(to_off):.3f}x ({min(to_off):.2f}-{max(to_off):.2f})  vs generate "
          f"{statistics.median(to_generate):.3f}x ({min(to_generate):.2f}-{max(to_generate):.2f})  per call "
          f"{statistics.mean(d for d, _ in counts[name]):.1f} drafted, "
          f"{statistics.mean(a for _, a in counts[name]):.1f} accepted")
