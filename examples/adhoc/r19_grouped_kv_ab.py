"""Round 19 (Intel Xeon with AVX-512, one thread): SmolLM2 with its EAGLE head, greedy, held-out chat prompts: plain
generate vs the chain ("auto") and a tree of N nodes, each with the engine's masked blocks attending over the grouped
key/value heads in place ("grouped") and with transformers' repeat_kv copy before the kernel ("repeated", what the
engine did before round 19), interleaved in a random order per round; a fresh cache directory, so every wrapper
starts from the prior cost curve. Prints the median speedup over generate, tokens per forward, and whether every
run's tokens equal generate's.
Usage: python examples/adhoc/r19_grouped_kv_ab.py ROUNDS NUM_PROMPTS MAX_NEW_TOKENS [N]"""
import os
import random
import statistics
import sys
import tempfile

os.environ["SELFSPEC_CACHE_DIR"] = tempfile.mkdtemp()
import torch  # noqa: E402
import transformers  # noqa: E402

import selfspec.attention_backends as backends  # noqa: E402
from selfspec.bench.models import load  # noqa: E402
from selfspec.bench.prompts import prompt_ids, prompt_texts  # noqa: E402
from selfspec.bench.settings import parse_args  # noqa: E402
from selfspec.engine import SelfSpecModel  # noqa: E402
from harness import timed_call  # noqa: E402  (examples/adhoc/harness.py)

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
rounds, num_prompts, max_new = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
tree_size = int(sys.argv[4]) if len(sys.argv) > 4 else 10

loaded = load(parse_args(["--model", "smollm2", "--heads", "none", "--eagle", "examples/smollm2/eagle"]), [])
model, tokenizer = loaded.model, loaded.tokenizer
kind, texts = prompt_texts(tokenizer, num_prompts)
prompts = prompt_ids(tokenizer, texts, kind, 2048, max_new, "cpu")
specs = {f"{name} {route}": SelfSpecModel(model, "eagle", heads="examples/smollm2/eagle", tokenizer=tokenizer,
                                          tree_size=n)
         for name, n in [("chain", None), (f"tree {tree_size}", tree_size)] for route in ("grouped", "repeated")}
variants = ["generate", *specs]
kw = dict(max_new_tokens=max_new, do_sample=False, eos_token_id=[])


def run(name, prompt):
    backends._KERNEL_TAKES_GROUPS = not name.endswith("repeated")  # (also names the variant's own cost curve)
    return timed_call(model, tokenizer, specs.get(name), prompt, **kw)


for name in specs:
    run(name, prompts[0][:, -32:])  # warm-up
speedups, tpf, identical = ({v: [] for v in variants} for _ in range(3))
order = random.Random(0)
for _ in range(rounds):
    for prompt in prompts:
        results = {}
        for name in order.sample(variants, len(variants)):
            results[name] = run(name, prompt)
        for name in variants:
            speedups[name].append(results["generate"][0] / results[name][0])
            tpf[name].append(results[name][1])
            identical[name].append(results[name][2] == results["generate"][2])
print(f"{rounds} rounds x {len(prompts)} prompts, {max_new} new tokens; medians of per-run ratios to generate")
for name in variants:
    print(f"{name:24s} {statistics.median(speedups[name]):.3f}x  tokens/forward {statistics.mean(tpf[name]):.2f}  "
          f"identical {sum(identical[name])}/{len(identical[name])}")
