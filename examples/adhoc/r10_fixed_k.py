"""SmolLM2 with its EAGLE head, greedy, one held-out chat prompt: plain generate vs selfspec at "auto" and fixed
k = 1, 2, 3, interleaved in random order per round; median speedup and tokens per forward. Round 10 asks: on a
CPU where verifying one draft costs 1.6 decodes (AMD EPYC, examples/adhoc/r10_small_m_gemm.py), does any k pay?
Usage: python examples/adhoc/r10_fixed_k.py ROUNDS"""
import random
import statistics
import sys
import time

import torch
import transformers

from selfspec.engine import SelfSpecModel
from selfspec.bench.settings import parse_args
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_texts, prompt_ids

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
loaded = load(parse_args(["--model", "smollm2", "--heads", "none", "--eagle", "examples/smollm2/eagle"]), [])
model, tokenizer = loaded.model, loaded.tokenizer
kind, texts = prompt_texts(tokenizer, 1)
prompt = prompt_ids(tokenizer, texts, kind, 2048, 128, "cpu")[0]
spec = SelfSpecModel(model, "eagle", heads="examples/smollm2/eagle", tokenizer=tokenizer)
kw = dict(max_new_tokens=128, do_sample=False, eos_token_id=[])
variants = {"generate": None, "auto": "auto", "k=1": 1, "k=2": 2, "k=3": 3}


def run(k):
    started = time.perf_counter()
    if k is None:
        out = model.generate(prompt, pad_token_id=tokenizer.eos_token_id, **kw)
        return time.perf_counter() - started, 1.0
    out = spec.generate(prompt[0], num_draft_tokens=k, **kw)
    return time.perf_counter() - started, out.stats.tokens_per_forward


spec.generate(prompt[0][-32:], max_new_tokens=32, eos_token_id=[])  # warm-up
times, per_forward, rng = {v: [] for v in variants}, {v: [] for v in variants}, random.Random(0)
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    order = list(variants)
    rng.shuffle(order)
    for name in order:
        seconds, tpf = run(variants[name])
        times[name].append(seconds)
        per_forward[name].append(tpf)
for name in variants:
    ratios = [g / t for g, t in zip(times["generate"], times[name])]
    print(f"{name:9s} {statistics.median(ratios):.2f}x of generate ({min(ratios):.2f}-{max(ratios):.2f}), "
          f"{statistics.median(per_forward[name]):.2f} tokens per forward")
