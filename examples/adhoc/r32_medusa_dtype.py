"""Round 32 (an AMD EPYC with AVX-512, one thread): SmolLM2's shipped Medusa heads with their weights streamed in
bfloat16 (draft_dtype="auto", the default) against float32 (draft_dtype=None). Round 31's main table read the float32
drafter at 1.63x of generate and the default at 1.42x, with first-draft acceptance 0.20 vs 0.16. Part 1: at a fixed
num_draft_tokens=4 (no adaptive policy), greedy, each variant's tokens per forward and acceptance by position.
Part 2: both at their defaults and speculation off, paired and interleaved with generate.
Usage: PYTHONPATH=examples/adhoc python examples/adhoc/r32_medusa_dtype.py PROMPTS ROUNDS"""
import sys

import torch
import transformers

from selfspec.engine import SelfSpecModel
from harness import greedy_against_generate, smollm2_chat  # examples/adhoc/harness.py

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
num_prompts, rounds = int(sys.argv[1]), int(sys.argv[2])
model, tokenizer, prompts = smollm2_chat(num_prompts, 128)
heads = "examples/smollm2/heads"
for dtype in ("auto", None):
    spec = SelfSpecModel(model, heads=heads, draft_dtype=dtype)
    tpf, by_position = [], []
    for prompt in prompts:
        out = spec.generate(prompt[0], max_new_tokens=128, do_sample=False, eos_token_id=[], num_draft_tokens=4)
        tpf.append(out.stats.tokens_per_forward)
        by_position.append(out.stats.acceptance_by_position)
    columns = [sum(p[i] for p in by_position) / len(by_position) for i in range(4)]
    print(f"k=4 draft_dtype={dtype}: tokens/forward {sum(tpf) / len(tpf):.3f}  acceptance by position "
          + " ".join(f"{c:.3f}" for c in columns), flush=True)
specs = {"off": SelfSpecModel(model, drafter="none"), "medusa bf16": SelfSpecModel(model, heads=heads),
         "medusa fp32": SelfSpecModel(model, heads=heads, draft_dtype=None)}
greedy_against_generate(model, tokenizer, specs, prompts, rounds, 128)
