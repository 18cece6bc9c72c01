"""Round 17 (AMD EPYC, one thread): what "auto" chooses for a tree, step by step. SmolLM2 with its EAGLE head, greedy,
held-out chat prompts, 96 tokens, a tree of N nodes (or "auto"): the kept tree cost curve at the start, then per call
its time, tokens per forward and the histogram of the depth "auto" asked for, and at a few steps the policy's view:
(k, expected tokens per unit cost by depth, the step cost by depth in decodes, learned per-step and per-level
overhead, acceptance estimates by depth). Two passes over the prompts with one wrapper.
Usage: python examples/adhoc/r17_tree_depth_trace.py NUM_PROMPTS N|auto"""
import collections
import sys
import time

import torch
import transformers

import selfspec.draft_length as dl
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_ids, prompt_texts
from selfspec.bench.settings import parse_args
from selfspec.engine import SelfSpecModel

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
loaded = load(parse_args(["--model", "smollm2", "--heads", "none", "--eagle", "examples/smollm2/eagle"]), [])
model, tokenizer = loaded.model, loaded.tokenizer
kind, texts = prompt_texts(tokenizer, int(sys.argv[1]))
prompts = [p[0] for p in prompt_ids(tokenizer, texts, kind, 2048, 96, "cpu")]
size = sys.argv[2] if sys.argv[2] == "auto" else int(sys.argv[2])
spec = SelfSpecModel(model, "eagle", heads="examples/smollm2/eagle", tokenizer=tokenizer, tree_size=size)
curve = spec.verify_cost()
print("tree_size", spec.tree_size, "curve at start", [round(curve(k), 3) for k in range(13)],
      "decode ms", round(curve.decode_seconds * 1e3, 1), "timed", curve.timed)
choose = dl.AdaptiveDraftLength.choose
log = []


def logged_choose(self):
    k = choose(self)
    tokens = self.expected_tokens_up_to(self.max_draft_tokens)
    costs = [self.step_cost(j) for j in range(self.max_draft_tokens + 1)]
    log.append((k, [round(t / c, 2) for t, c in zip(tokens, costs)], [round(c, 2) for c in costs],
                round(self.overhead.per_step, 3), round(self.overhead.per_token, 3),
                [round(a, 2) for a in self.acceptance()[:4]]))
    return k


dl.AdaptiveDraftLength.choose = logged_choose
for _ in range(2):
    for prompt in prompts:
        log.clear()
        started = time.perf_counter()
        out = spec.generate(prompt, max_new_tokens=96, eos_token_id=[], do_sample=False)
        seconds = time.perf_counter() - started
        depths = collections.Counter(k for k, *_ in log)
        print(f"{seconds:.2f}s tpf {out.stats.tokens_per_forward:.2f} k hist {sorted(depths.items())}")
        for i in (0, 5, 20, len(log) // 2, len(log) - 1):
            print("   step", i, log[i])
    print("curve now", [round(curve(k), 3) for k in range(13)], "timed", curve.timed)
