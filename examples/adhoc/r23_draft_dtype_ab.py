"""Round 23 (AMD EPYC with AVX-512, one thread): SmolLM2 with its EAGLE head (and its Medusa heads), greedy, held-out
chat prompts: plain generate vs each drafter with its weights streamed in bfloat16 through the few-row kernel
(`draft_dtype="auto"`, the default) vs in float32 (`draft_dtype=None`, before round 23), interleaved in a random
order per round. Prints the median speedup over generate, tokens per forward, nodes per step, identical tokens.
Usage: python examples/adhoc/r23_draft_dtype_ab.py ROUNDS NUM_PROMPTS MAX_NEW_TOKENS [medusa]"""
import sys

import torch
import transformers

from selfspec.engine import SelfSpecModel
from harness import greedy_against_generate, smollm2_chat  # examples/adhoc/harness.py

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
rounds, num_prompts, max_new = (int(a) for a in sys.argv[1:4])
heads = "examples/smollm2/heads" if sys.argv[4:] == ["medusa"] else "examples/smollm2/eagle"

model, tokenizer, prompts = smollm2_chat(num_prompts, max_new)
shapes, dtypes = (("default", "auto"), ("chain", None)), (("bf16", "auto"), ("fp32", None))
specs = {f"{shape}, {name}": SelfSpecModel(model, heads=heads, tokenizer=tokenizer, tree_size=size, draft_dtype=dtype)
         for shape, size in shapes for name, dtype in dtypes}
assert all(spec.draft_dtype is (torch.bfloat16 if "bf16" in name else None) for name, spec in specs.items())
greedy_against_generate(model, tokenizer, specs, prompts, rounds, max_new)
