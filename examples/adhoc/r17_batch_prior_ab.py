"""Round 17 (AMD EPYC, one thread): a batch's "auto" with its rows' acceptance prior at 0.5 (the single-sequence
default) against lower priors and against a larger min_gain for the planner, and fixed k = 0; interleaved in a random
order per round, medians of each variant's time over k = 0's in the same round. Each row's policy starts every call
from the prior: on the reference model at batch 8 (Medusa heads, ~0.3 first-draft acceptance) the planner drafted
w = 2 for the first 30-40 steps of a 96-token call (`r17_batch8_trace.py`), where a drafting step cost 1.44-1.52x a
plain one for 1.27-1.38x the tokens.
Round 17 then kept a batch step's overhead per wrapper (`SelfSpecModel.batch_step_overhead`); "auto overhead per
call" restores a fresh one per batch, as before.
Usage: python examples/adhoc/r17_batch_prior_ab.py ROUNDS B TOKENS reference|smollm2 [VARIANT,VARIANT...]"""
import random
import statistics
import sys
import time
from collections import defaultdict

import torch
import transformers

import selfspec.batch as batch_module
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_ids, prompt_texts
from selfspec.bench.settings import parse_args
from selfspec.draft_length import StepOverhead
from selfspec.engine import SelfSpecModel

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
rounds, batch, max_new, which = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if which == "reference":
    args = ["--model", "examples/reference/model", "--heads", "none", "--eagle", "none"]
    heads = "examples/reference/heads"
else:
    args = ["--model", "smollm2", "--heads", "none", "--eagle", "none"]
    heads = "examples/smollm2/eagle"
loaded = load(parse_args(args), [])
model, tokenizer = loaded.model, loaded.tokenizer
kind, texts = prompt_texts(tokenizer, 16)
pool = prompt_ids(tokenizer, texts, kind, 8192, max_new, "cpu")
prompts = [pool[i % len(pool)][0] for i in range(batch)]
spec = SelfSpecModel(model, heads=heads, tokenizer=tokenizer)
row_policy, planner = batch_module._row_policy, batch_module._batch_planner
setting = {"prior": 0.5, "min_gain": 0.02, "fresh_overhead": False}


def patched_row_policy(spec, options):
    policy = row_policy(spec, options)
    if hasattr(policy, "prior_acceptance"):
        policy.prior_acceptance = setting["prior"]
    return policy


def patched_planner(spec, options):
    made = planner(spec, options)
    if made is not None:
        made.min_gain = setting["min_gain"]
        if setting["fresh_overhead"]:  # as before round 17: a planner's own overhead, from 0 per drafted token
            made.overhead = StepOverhead(made.decay)
    return made


batch_module._row_policy, batch_module._batch_planner = patched_row_policy, patched_planner
VARIANTS = {"auto": (0.5, 0.02, False, {}), "auto prior 0.3": (0.3, 0.02, False, {}),
            "auto prior 0.2": (0.2, 0.02, False, {}), "auto prior 0 (never drafts)": (0.0, 0.02, False, {}),
            "auto min_gain 0.1": (0.5, 0.1, False, {}), "auto overhead per call": (0.5, 0.02, True, {}),
            "k0": (0.5, 0.02, False, dict(num_draft_tokens=0))}
chosen = sys.argv[5].split(",") if len(sys.argv) > 5 else list(VARIANTS)
variants = {name: VARIANTS[name] for name in chosen + ["k0"] * ("k0" not in chosen)}
kw = dict(max_new_tokens=max_new, eos_token_id=[])
spec.generate([p[-16:] for p in prompts[:2]], **kw)  # warm-up
ratios, per_forward, same = defaultdict(list), defaultdict(list), defaultdict(int)
rng = random.Random(0)
for _ in range(rounds):
    order = list(variants)
    rng.shuffle(order)
    seconds, tokens = {}, {}
    for name in order:
        setting["prior"], setting["min_gain"], setting["fresh_overhead"], extra = variants[name]
        started = time.perf_counter()
        out = spec.generate(prompts, **kw, **extra)
        seconds[name] = time.perf_counter() - started
        tokens[name] = [s.tolist() for s in out.sequences]
        per_forward[name].append(out.stats.tokens_per_forward)
    for name in variants:
        ratios[name].append(seconds["k0"] / seconds[name])
        same[name] += tokens[name] == tokens["k0"]
print(f"{which}, batch {batch}, {max_new} tokens, {rounds} rounds, greedy")
for name in variants:
    r = ratios[name]
    print(f"  {name:28s} {statistics.median(r):.3f}x of k0 ({min(r):.2f}-{max(r):.2f}), "
          f"{statistics.median(per_forward[name]):.2f} tokens per forward, identical {same[name]}/{len(r)}")
