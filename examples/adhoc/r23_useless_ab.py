"""Round 23 (AMD EPYC with AVX-512, one thread): the two SmolLM2 useless-drafts rows round 23's benchmark missed
(greedy, 128 tokens, the benchmark's 2 prompts): random (untrained) Medusa heads (the benchmark's, seed 0 + 2) with
their weights streamed in bfloat16 (`draft_dtype="auto"`, the default) and in float32 (`draft_dtype=None`), and early
exit at the untrained layer 8 (its drafting runs the model's own layers: no bfloat16 weights), against speculation off
and plain generate, paired and interleaved in a random order per prompt and round. Prints each variant's paired median
ratio to speculation off and to generate, and drafts / accepted per call.
Usage: python examples/adhoc/r23_useless_ab.py ROUNDS"""
import statistics
import sys

import torch
import transformers

from selfspec.bench.methods import random_heads
from selfspec.engine import SelfSpecModel
from harness import interleaved, smollm2_chat, timed_call  # examples/adhoc/harness.py

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
model, tokenizer, prompts = smollm2_chat(2, 128)
noise = random_heads(model, seed=2)  # the shipped heads' shape: 4 heads, 1 layer, the shared LM head
variants = {"off": SelfSpecModel(model, drafter="none"),
            "random medusa, bf16": SelfSpecModel(model, "medusa", heads=noise),
            "random medusa, fp32": SelfSpecModel(model, "medusa", heads=noise, draft_dtype=None),
            "early exit L=8": SelfSpecModel(model, "early_exit", exit_layer=8)}
assert variants["random medusa, bf16"].draft_dtype is torch.bfloat16
kwargs = dict(max_new_tokens=128, do_sample=False, eos_token_id=[])


def run(name, prompt):
    return timed_call(model, tokenizer, variants.get(name), prompt, **kwargs)


for name in ["generate", *variants]:  # warm-up
    timed_call(model, tokenizer, variants.get(name), prompts[0][:, -32:], **{**kwargs, "max_new_tokens": 32})
results = list(interleaved(["generate", *variants], prompts, int(sys.argv[1]) if len(sys.argv) > 1 else 4, run))
for name in variants:
    to_off = [r["off"].seconds / r[name].seconds for r in results]
    to_generate = [r["generate"].seconds / r[name].seconds for r in results]
    print(f"{name:22s} vs off {statistics.median(to_off):.3f}x ({min(to_off):.2f}-{max(to_off):.2f})  vs generate "
          f"{statistics.median(to_generate):.3f}x ({min(to_generate):.2f}-{max(to_generate):.2f})  per call "
          f"{statistics.mean(r[name].stats.drafted for r in results):.1f} drafted, "
          f"{statistics.mean(r[name].stats.accepted for r in results):.1f} accepted")
