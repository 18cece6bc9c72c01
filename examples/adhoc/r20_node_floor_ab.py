"""Round 20 (Intel Xeon with AVX-512, one thread): SmolLM2 with its EAGLE head, greedy, held-out chat prompts: plain
generate vs a tree of N nodes ("auto" depth) keeping only nodes whose cumulative draft probability exceeds a floor
(`SelfSpecModel.min_node_probability`, which "auto" trees set on a CPU with the few-row kernel; 0 = every one of
the N best, as before; first run with it as an EAGLE drafter option, same code path), interleaved in a random order
per round, with the user's cache directory. Prints the median speedup over generate, tokens per forward, nodes
verified per step, and whether every run's tokens equal generate's.
Usage: python examples/adhoc/r20_node_floor_ab.py ROUNDS NUM_PROMPTS MAX_NEW_TOKENS N FLOOR [FLOOR ...]"""
import sys

import torch
import transformers

from selfspec.engine import SelfSpecModel
from harness import greedy_against_generate, smollm2_chat  # examples/adhoc/harness.py

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
rounds, num_prompts, max_new, tree_size = (int(a) for a in sys.argv[1:5])
floors = [float(a) for a in sys.argv[5:]]

model, tokenizer, prompts = smollm2_chat(num_prompts, max_new)
specs = {f"floor {f}": SelfSpecModel(model, "eagle", heads="examples/smollm2/eagle", tokenizer=tokenizer,
                                     tree_size=tree_size) for f in [0.0, *floors]}
for f, spec in zip([0.0, *floors], specs.values()):
    spec.min_node_probability = f
greedy_against_generate(model, tokenizer, specs, prompts, rounds, max_new)
