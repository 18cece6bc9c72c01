"""Round 34 (the AMD EPYC, one thread): the EAGLE drafter's probes reading at most `PROBE_CATCH_UP` (16) of the
states they have not seen ("capped") against reading all of them ("all", round 33), on the reference model's random
(untrained) EAGLE head at its defaults, against speculation off; 96 tokens without EOS, the benchmark's 4 held-out
code prompts, greedy and sampled (T=0.7, top-p 0.9), ROUNDS rounds interleaved; per pair: tokens per second over
speculation off's of the same round, prompt and mode; medians. Then the shipped SmolLM2 EAGLE tree at its defaults,
greedy, capped against all ("smollm2" argument), one after the other: tokens per forward and the probes made (the cap
touches probes only; "auto" also follows timings, so tokens per forward vary a little from run to run anyway).
Usage: PYTHONPATH=examples/adhoc python examples/adhoc/r34_probe_catch_up_ab.py ROUNDS [smollm2 N_PROMPTS]"""
import statistics
import sys
import time

import torch
import transformers

import selfspec.drafters.eagle as eagle
from selfspec.bench.methods import random_eagle_head
from selfspec.bench.prompts import prompt_ids, prompt_texts
from selfspec.engine import SelfSpecModel
from selfspec.loading import load_model, load_tokenizer
from harness import REFERENCE, interleaved, smollm2_chat  # examples/adhoc/harness.py

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
CAPS = {"capped": eagle.PROBE_CATCH_UP, "all": 10**9}
rounds = int(sys.argv[1])
if len(sys.argv) > 2 and sys.argv[2] == "smollm2":
    model, tokenizer, prompts = smollm2_chat(int(sys.argv[3]), 128)
    spec = SelfSpecModel(model, heads="examples/smollm2/eagle", tokenizer=tokenizer)
    probes, propose = [], eagle.EagleDrafter.propose

    def counting(drafter, context):
        if context.probe:
            probes.append(context.hidden_states.shape[0])
        return propose(drafter, context)

    eagle.EagleDrafter.propose = counting
    for name, cap in CAPS.items():
        eagle.PROBE_CATCH_UP, forwards, tokens = cap, 0, 0
        probes.clear()
        for _ in range(rounds):
            for prompt in prompts:
                stats = spec.generate(prompt, max_new_tokens=128, do_sample=False).stats
                forwards, tokens = forwards + stats.target_forwards, tokens + stats.new_tokens
        print(f"SmolLM2 EAGLE tree, probes reading {name}: {tokens / forwards:.3f} tokens per forward, {len(probes)} "
              f"probes reading {sum(min(n, cap) for n in probes)} of {sum(probes)} unseen states")
    sys.exit()

model, tokenizer = load_model(REFERENCE), load_tokenizer(REFERENCE)
kind, texts = prompt_texts(tokenizer, 4)
prompts = prompt_ids(tokenizer, texts, kind, 8192, 96, "cpu")
off = SelfSpecModel(model, drafter="none")
head = random_eagle_head(model, seed=3)
specs = {"capped": SelfSpecModel(model, heads=head), "all": SelfSpecModel(model, heads=head)}
MODES = {"greedy": {}, "sampled": dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=0)}


def run(variant, prompt):
    name, mode = variant.split("/")
    eagle.PROBE_CATCH_UP = CAPS.get(name, 0)
    spec = specs.get(name, off)
    started = time.perf_counter()
    out = spec.generate(prompt, max_new_tokens=96, eos_token_id=[], **MODES[mode])
    return 96 / (time.perf_counter() - started), out.stats.drafted


variants = [f"{name}/{mode}" for name in ("off", *specs) for mode in MODES]
for v in variants:  # warm-up
    run(v, prompts[0])
ratios = {v: [] for v in variants if not v.startswith("off")}
drafted = {v: 0 for v in ratios}
for results in interleaved(variants, prompts, rounds, run):
    for v in ratios:
        ratios[v].append(results[v][0] / results["off/" + v.split("/")[1]][0])
        drafted[v] += results[v][1]
calls = rounds * len(prompts)
for v, values in ratios.items():
    print(f"{v:15s} vs speculation off: median {statistics.median(values):.3f} (pairs {min(values):.2f}-"
          f"{max(values):.2f}, mean {statistics.mean(values):.3f}), {drafted[v] / calls:.1f} tokens drafted a call")
