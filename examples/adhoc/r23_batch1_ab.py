"""Round 23 (AMD EPYC with AVX-512, one thread): SmolLM2 with its EAGLE head, greedy, 64 tokens (the batch
benchmark's settings): a batch of one prompt (`generate([prompt])`, the batched loop) against the same prompt alone
(`generate(prompt)`), both chains (the batch benchmark's wrapper, `tree_size=None`), with the drafter's weights in
bfloat16 (`draft_dtype="auto"`, the default) and in float32 (`draft_dtype=None`), paired and interleaved in a random
order per prompt and round. Round 23's batch benchmark read batch 1 at 0.92x of one by one (round 21: 0.98x).
Usage: python examples/adhoc/r23_batch1_ab.py ROUNDS NUM_PROMPTS"""
import statistics
import sys

import torch
import transformers

from selfspec import SelfSpecModel
from selfspec.bench.batch import parse_args, selfspec_batch, selfspec_one_by_one
from selfspec.bench.prompts import prompt_ids, prompt_texts
from selfspec.loading import load_model, load_tokenizer
from harness import interleaved  # examples/adhoc/harness.py

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
rounds, num_prompts = int(sys.argv[1]), int(sys.argv[2])
settings = parse_args(["--model", "smollm2", "--heads", "examples/smollm2/eagle", "--max-new-tokens", "64"])
model, tokenizer = load_model("smollm2", dtype=torch.float32), load_tokenizer("smollm2")
kind, texts = prompt_texts(tokenizer, num_prompts)
prompts = prompt_ids(tokenizer, texts, kind, 8192, 64, "cpu")
eos = tokenizer.eos_token_id
specs = {dtype: SelfSpecModel(model, heads=settings.heads, tokenizer=tokenizer, tree_size=None, draft_dtype=dtype)
         for dtype in ("auto", None)}
variants = {f"{how}, {'bf16' if dtype else 'fp32'}": (how, spec) for dtype, spec in specs.items()
            for how in ("batch of 1", "alone")}


def call(how, spec, prompt):
    return (selfspec_batch if how == "batch of 1" else selfspec_one_by_one)(spec, [prompt], settings, eos)


for how, spec in variants.values():  # warm-up
    call(how, spec, prompts[0][:, -16:])
results = list(interleaved(list(variants), prompts, rounds, lambda name, prompt: call(*variants[name], prompt)))
seconds = {name: [r[name].seconds for r in results] for name in variants}
tokens = {name: [r[name].new_tokens[0] for r in results] for name in variants}
for dtype in ("bf16", "fp32"):
    ratios = [a / b for a, b in zip(seconds[f"alone, {dtype}"], seconds[f"batch of 1, {dtype}"])]
    same = sum(x == y for x, y in zip(tokens[f"alone, {dtype}"], tokens[f"batch of 1, {dtype}"]))
    print(f"{dtype}: batch of 1 / alone {statistics.median(ratios):.3f}x ({min(ratios):.2f}-{max(ratios):.2f}), "
          f"identical {same}/{len(ratios)}")
bf16_gain = [a / b for a, b in zip(seconds["alone, fp32"], seconds["alone, bf16"])]
print(f"alone: bf16 / fp32 drafter {statistics.median(bf16_gain):.3f}x")
