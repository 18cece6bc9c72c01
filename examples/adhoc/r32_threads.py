"""Round 32 (an AMD EPYC with AVX-512, 2 vCPUs): every benchmark so far ran one torch thread; a user's process gets
torch's default (one per core). SmolLM2, held-out chat prompts, greedy, 128 tokens without EOS: plain generate,
speculation off and the shipped EAGLE head at its defaults, paired and interleaved, at THREADS torch threads.
Usage: PYTHONPATH=examples/adhoc python examples/adhoc/r32_threads.py THREADS PROMPTS ROUNDS"""
import sys

import torch
import transformers

from selfspec.engine import SelfSpecModel
from harness import greedy_against_generate, smollm2_chat  # examples/adhoc/harness.py

threads, num_prompts, rounds = (int(a) for a in sys.argv[1:4])
torch.set_num_threads(threads)
transformers.logging.set_verbosity_error()
model, tokenizer, prompts = smollm2_chat(num_prompts, 128)
specs = {"off": SelfSpecModel(model, drafter="none"), "eagle": SelfSpecModel(model, heads="examples/smollm2/eagle")}
print(f"{torch.get_num_threads()} threads; one-row products through the kernel: {specs['off'].few_row_linears.one_row}")
greedy_against_generate(model, tokenizer, specs, prompts, rounds, 128)
