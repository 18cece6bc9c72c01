"""Round 33 (the AMD EPYC, one thread): where the reference model's random (untrained) EAGLE head loses its 3-6 %
against speculation off (the useless-drafts row that misses most often: sampled 0.94x, pairs 0.92-0.95, in round
33's second run). Sampled at T=0.7, top-p 0.9, 96 tokens without EOS, the benchmark's 4 held-out code prompts, ROUNDS
rounds, speculation off and the head at its defaults interleaved; the engine's step parts timed in place (the
drafter's proposal, the draft-length policy's choice, the verify step and in it the target's forward and logits,
the feedback) and summed over all calls.
Usage: PYTHONPATH=examples/adhoc python examples/adhoc/r33_random_eagle_breakdown.py ROUNDS"""
import collections
import sys
import time

import torch
import transformers

from selfspec import draft_length
from selfspec.bench.methods import random_eagle_head
from selfspec.bench.prompts import prompt_ids, prompt_texts
from selfspec.engine import SelfSpecModel
from selfspec.loading import load_model, load_tokenizer
from harness import REFERENCE, interleaved  # examples/adhoc/harness.py

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
model, tokenizer = load_model(REFERENCE), load_tokenizer(REFERENCE)
kind, texts = prompt_texts(tokenizer, 4)
prompts = prompt_ids(tokenizer, texts, kind, 8192, 96, "cpu")
specs = {"off": SelfSpecModel(model, drafter="none"),
         "eagle": SelfSpecModel(model, heads=random_eagle_head(model, seed=3))}
seconds, running = collections.defaultdict(float), [None]


def timed(part, method):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            seconds[(running[0], part)] += time.perf_counter() - started
    return wrapper


for owner, parts in ((SelfSpecModel, ["_propose", "_verify_step", "_observe"]),
                     (draft_length.AdaptiveDraftLength, ["choose"]),
                     (type(specs["off"].target), ["forward", "logits"])):
    for part in parts:
        setattr(owner, part, timed(part, getattr(owner, part)))
kwargs = dict(max_new_tokens=96, eos_token_id=[], do_sample=True, temperature=0.7, top_p=0.9, top_k=0)


def run(name, prompt):
    running[0] = name
    started = time.perf_counter()
    specs[name].generate(prompt, **kwargs)
    seconds[(name, "whole call")] += time.perf_counter() - started


for name in specs:  # warm-up
    run(name, prompts[0])
seconds.clear()
rounds = int(sys.argv[1])
for _ in interleaved(list(specs), prompts, rounds, run):
    pass
steps = rounds * len(prompts) * 96
print(f"{rounds} rounds x {len(prompts)} prompts x 96 tokens, summed over calls (per step: / {steps})")
for part in ("whole call", "_verify_step", "forward", "logits", "_propose", "choose", "_observe"):
    off, eagle = seconds[("off", part)], seconds[("eagle", part)]
    print(f"{part:13s} off {off * 1e3:7.1f} ms  eagle {eagle * 1e3:7.1f} ms  difference {(eagle - off) * 1e3:+6.1f} ms "
          f"({(eagle - off) / seconds[('off', 'whole call')] * 100:+.1f} % of off's calls)")
