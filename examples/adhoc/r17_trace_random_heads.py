"""Round 17 (AMD EPYC, one thread): what "auto" does with random (untrained) Medusa heads, greedy, the useless-drafts
benchmark's case. SmolLM2, the benchmark's random heads (shaped like the shipped ones, seed 2), held-out chat prompts,
128 tokens, two calls per prompt on one wrapper: for every step that asked for drafts, (step, (k asked, drafted,
accepted, a probe, acceptance estimates of depths 1-2, decline rate)).
Usage: python examples/adhoc/r17_trace_random_heads.py"""
import torch
import transformers

import selfspec.draft_length as dl
from selfspec.bench.methods import random_heads
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_ids, prompt_texts
from selfspec.bench.settings import parse_args
from selfspec.engine import SelfSpecModel

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
loaded = load(parse_args(["--model", "smollm2", "--eagle", "none"]), [])
model, tokenizer = loaded.model, loaded.tokenizer
kind, texts = prompt_texts(tokenizer, 2)
prompts = [p[0] for p in prompt_ids(tokenizer, texts, kind, 2048, 128, "cpu")]
spec = SelfSpecModel(model, "medusa", heads=random_heads(model, like=loaded.heads, seed=2))
observe = dl.AdaptiveDraftLength.observe
log = []


def logged_observe(self, num_drafted, num_accepted, seconds=None, asked=None):
    log.append((self._last_asked, num_drafted, num_accepted, self.probes.probing,
                [round(a, 2) for a in self.acceptance()[:2]], round(self.decline_rate(), 2)))
    return observe(self, num_drafted, num_accepted, seconds, asked)


dl.AdaptiveDraftLength.observe = logged_observe
for prompt in prompts:
    for _ in range(2):
        log.clear()
        spec.generate(prompt, max_new_tokens=128, eos_token_id=[], do_sample=False)
        print([(i, entry) for i, entry in enumerate(log) if entry[0] > 0])
