"""Paired, interleaved A/B (round 14, AMD EPYC, one thread): SmolLM2 early exit at layer 8 (untrained for it),
sampled at the useless-drafts benchmark's t=0.7 top-p=0.9, default "auto", vs speculation off and vs generate, 128
new tokens without EOS, on the benchmark's held-out chat prompts; per-pair ratios and the drafts / shadow probes per
call. The benchmark's row read 0.92x of speculation off (0.88-1.02) but 1.07x of generate in round 14 (10 runs).
Usage: python examples/adhoc/r14_ab_early_exit_sampled.py ROUNDS [NUM_PROMPTS]"""
import random
import statistics
import sys
import time

import torch

torch.set_num_threads(1)
import transformers  # noqa: E402

transformers.logging.set_verbosity_error()
from selfspec.bench.models import load  # noqa: E402
from selfspec.bench.prompts import prompt_ids, prompt_texts  # noqa: E402
from selfspec.bench.settings import parse_args  # noqa: E402
from selfspec.engine import SelfSpecModel  # noqa: E402

loaded = load(parse_args(["--model", "smollm2", "--heads", "none", "--eagle", "none"]), [])
model = loaded.model
kind, texts = prompt_texts(loaded.tokenizer, int(sys.argv[2]) if len(sys.argv) > 2 else 2)
prompts = [p[0] for p in prompt_ids(loaded.tokenizer, texts, kind, 2048, 128, "cpu")]
off, early = SelfSpecModel(model, drafter="none"), SelfSpecModel(model, drafter="early_exit", exit_layer=8)
kw = dict(max_new_tokens=128, do_sample=True, temperature=0.7, top_p=0.9, eos_token_id=[])


def generate(p):
    return model.generate(p[None], max_new_tokens=128, do_sample=True, temperature=0.7, top_p=0.9, top_k=0,
                          eos_token_id=[], pad_token_id=loaded.pad_token_id, attention_mask=torch.ones_like(p[None]))


variants = {"generate": generate, "off": lambda p: off.generate(p, **kw), "early": lambda p: early.generate(p, **kw)}
for run in variants.values():
    run(prompts[0][-32:])
rng, times, drafted = random.Random(0), {k: [] for k in variants}, []
for rnd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    for p in prompts:
        order = list(variants)
        rng.shuffle(order)
        for name in order:
            t = time.perf_counter()
            out = variants[name](p)
            times[name].append(time.perf_counter() - t)
            if name == "early":
                drafted.append((out.stats.drafted, out.stats.probed))
for base in ("off", "generate"):
    r = [b / e for b, e in zip(times[base], times["early"])]
    print(f"early vs {base}: median pair {statistics.median(r):.3f}x ({min(r):.3f}-{max(r):.3f}), "
          f"total {sum(times[base]) / sum(times['early']):.3f}x over {len(r)} pairs")
r = [g / o for g, o in zip(times["generate"], times["off"])]
print(f"off vs generate: median pair {statistics.median(r):.3f}x ({min(r):.3f}-{max(r):.3f})")
print(f"early exit (drafted, probed in shadow) per call: {drafted}")
