"""Round 26 (Intel Xeon with AMX, one thread): the SmolLM2 useless-drafts rows round 26's benchmark missed or did not
reach (its --time-limit stopped it before the last case): a random (untrained) EAGLE head (the benchmark's, seed 0 + 3;
it drafts nothing) greedy, and a fresh SelfSpecModel per call with the shipped Medusa heads (as the command line builds
one), greedy and sampled (T=0.7, top-p 0.9; transformers gets top_k=0), against speculation off and plain generate, 128
tokens without EOS, the benchmark's 2 prompts, paired and interleaved in a random order per prompt, round and mode.
Prints each variant's paired median ratio to speculation off and to generate, and drafts / accepted per call.
Usage: python examples/adhoc/r26_useless_ab.py ROUNDS"""
import statistics
import sys
import time

import torch
import transformers

from selfspec.bench.methods import random_eagle_head
from selfspec.engine import SelfSpecModel
from harness import interleaved, smollm2_chat, timed_call  # examples/adhoc/harness.py

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
model, tokenizer, prompts = smollm2_chat(2, 128)
eagle_noise = random_eagle_head(model, seed=3)
built = {"off": SelfSpecModel(model, drafter="none"), "random eagle": SelfSpecModel(model, heads=eagle_noise)}
modes = {"greedy": dict(do_sample=False), "sampled": dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=0)}
per_mode = {"greedy": ["generate", "off", "random eagle", "fresh medusa"],
            "sampled": ["generate", "off", "fresh medusa"]}


def run(name, prompt, mode):
    kwargs = dict(max_new_tokens=128, eos_token_id=[], **modes[mode])
    if name == "fresh medusa":  # built inside the timed span, so its wrapping is timed too
        started = time.perf_counter()
        spec = SelfSpecModel(model, heads="examples/smollm2/heads", tokenizer=tokenizer)
        timed = timed_call(model, tokenizer, spec, prompt, **kwargs)
        return timed._replace(seconds=time.perf_counter() - started)
    return timed_call(model, tokenizer, built.get(name), prompt, **kwargs)


for mode, names in per_mode.items():  # warm-up
    for name in names:
        run(name, prompts[0][:, -32:], mode)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
results = {mode: [] for mode in modes}
for r in range(rounds):
    for mode, names in per_mode.items():
        results[mode] += list(interleaved(names, prompts, 1, lambda n, p: run(n, p, mode), seed=r))
    print(f"round {r + 1} done", flush=True)
for mode, names in per_mode.items():
    for name in names[2:]:
        to_off = [r["off"].seconds / r[name].seconds for r in results[mode]]
        to_generate = [r["generate"].seconds / r[name].seconds for r in results[mode]]
        print(f"{mode:8s} {name:14s} vs off {statistics.median(to_off):.3f}x ({min(to_off):.2f}-{max(to_off):.2f})  "
              f"vs generate {statistics.median(to_generate):.3f}x ({min(to_generate):.2f}-{max(to_generate):.2f})  "
              f"per call {statistics.mean(r[name].stats.drafted for r in results[mode]):.1f} drafted, "
              f"{statistics.mean(r[name].stats.accepted for r in results[mode]):.1f} accepted")
