"""Round 33: round 21's tree-size A/B at THREADS torch threads (the few-row kernel splits its products between them
since round 33). Round 21 (AMD EPYC with AVX-512, one thread): SmolLM2 with its EAGLE head, greedy, held-out chat
prompts: plain generate vs the chain ("auto" draft length) vs trees of N nodes each keeping only nodes whose
cumulative draft probability exceeds a floor (`SelfSpecModel.min_node_probability`; "auto" trees on a CPU with the
kernel are 10:0.02), interleaved in a random order per round, with the user's cache directory. Prints the median
speedup over generate, tokens per forward, nodes verified per step, and whether every run's tokens equal generate's.
Usage: PYTHONPATH=examples/adhoc python examples/adhoc/r33_tree_size_threads.py THREADS ROUNDS NUM_PROMPTS
MAX_NEW_TOKENS VARIANT [VARIANT ...]
where a VARIANT is "chain" or N:FLOOR (e.g. 10:0.02)."""
import sys

import torch
import transformers

from selfspec.engine import SelfSpecModel
from harness import greedy_against_generate, smollm2_chat  # examples/adhoc/harness.py

torch.set_num_threads(int(sys.argv[1]))
transformers.logging.set_verbosity_error()
rounds, num_prompts, max_new = (int(a) for a in sys.argv[2:5])

model, tokenizer, prompts = smollm2_chat(num_prompts, max_new)
specs = {}
for variant in sys.argv[5:]:
    size, _, floor = variant.partition(":")
    specs[variant] = SelfSpecModel(model, "eagle", heads="examples/smollm2/eagle", tokenizer=tokenizer,
                                   tree_size=None if size == "chain" else int(size))
    specs[variant].min_node_probability = float(floor or 0.0)
greedy_against_generate(model, tokenizer, specs, prompts, rounds, max_new)
