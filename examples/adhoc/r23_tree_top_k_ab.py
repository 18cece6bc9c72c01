"""Round 23 (AMD EPYC with AVX-512, one thread): SmolLM2 with its EAGLE head, greedy, held-out chat prompts: plain
generate vs the default tree ("auto": 10 nodes above 0.02 on this CPU) with `tree_top_k` K (nodes expanded per level
and children per expanded node; 4 is the default, never measured before round 23), interleaved in a random order per
round. Prints the median speedup over generate, tokens per forward, nodes per step, identical tokens.
Usage: python examples/adhoc/r23_tree_top_k_ab.py ROUNDS NUM_PROMPTS MAX_NEW_TOKENS K [K ...]"""
import sys

import torch
import transformers

from selfspec.engine import SelfSpecModel
from harness import greedy_against_generate, smollm2_chat  # examples/adhoc/harness.py

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
rounds, num_prompts, max_new = (int(a) for a in sys.argv[1:4])

model, tokenizer, prompts = smollm2_chat(num_prompts, max_new)
specs = {f"top-k {k}": SelfSpecModel(model, heads="examples/smollm2/eagle", tokenizer=tokenizer, tree_top_k=int(k))
         for k in sys.argv[4:]}
assert all(spec.tree_size == 10 for spec in specs.values())
greedy_against_generate(model, tokenizer, specs, prompts, rounds, max_new)
