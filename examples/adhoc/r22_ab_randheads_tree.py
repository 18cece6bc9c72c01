"""Paired A/B: random (untrained) Medusa heads as the default's trees ("auto": 10 nodes on a CPU with the few-row
kernel) vs as chains (tree_size=None) vs speculation off, sampled (T=0.7, top-p 0.9) by default, the row round 22's
reference-model useless benchmark missed (0.94x of speculation off). Counts drafts and accepted drafts per call.
With a 4th argument "eagle": a random EAGLE head (the benchmark's random_eagle_head) instead of Medusa heads.
Usage: python examples/adhoc/r22_ab_randheads_tree.py ROUNDS [reference|smollm2] [sample|greedy] [medusa|eagle]"""
import random, statistics, sys, time, torch
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
from selfspec.engine import SelfSpecModel
from selfspec.bench.settings import parse_args
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_texts, prompt_ids
from selfspec.bench.methods import random_eagle_head, random_heads

smol = (sys.argv[2] if len(sys.argv) > 2 else "reference") == "smollm2"
sample = (sys.argv[3] if len(sys.argv) > 3 else "sample") == "sample"
settings = parse_args(["--model", "smollm2", "--heads", "examples/smollm2/heads", "--eagle", "none"] if smol else [])
loaded = load(settings, [])
model = loaded.model
kind, texts = prompt_texts(loaded.tokenizer, 2 if smol else 4)
prompts = [p[0] for p in prompt_ids(loaded.tokenizer, texts, kind, 2048 if smol else 256, 128 if smol else 96, "cpu")]
eagle = (sys.argv[4] if len(sys.argv) > 4 else "medusa") == "eagle"
noise = random_eagle_head(model, seed=3) if eagle else random_heads(model, like=loaded.heads, seed=2)  # seed 0 + 3/2
drafter = "eagle" if eagle else "medusa"
variants = {"off": SelfSpecModel(model, drafter="none"),
            "tree": SelfSpecModel(model, drafter, heads=noise, tree_size="auto" if eagle else 10),
            "chain": SelfSpecModel(model, drafter, heads=noise, tree_size=None)}
if not eagle:  # Medusa trees as "auto" drafted them when round 22 measured this (10 nodes above 0.02)
    variants["tree"].min_node_probability = 0.02
print("tree size:", variants["tree"].tree_size)
kw = dict(max_new_tokens=128 if smol else 96, eos_token_id=[])
kw.update(do_sample=True, temperature=0.7, top_p=0.9) if sample else None
for v in variants.values():  # warm-up (and the cost curve, if not on disk yet)
    v.generate(prompts[0][-32:], **{**kw, "max_new_tokens": 32})
rng, times = random.Random(0), {k: [] for k in variants}
counts = {k: [] for k in variants}
for rnd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 6):
    for i, p in enumerate(prompts):
        order = list(variants); rng.shuffle(order)
        for name in order:
            torch.manual_seed(rnd * 100 + i)
            t = time.perf_counter()
            out = variants[name].generate(p, **kw)
            times[name].append(time.perf_counter() - t)
            counts[name].append((out.stats.drafted, out.stats.accepted))
for name in ("tree", "chain"):
    ratios = [o / n for o, n in zip(times["off"], times[name])]
    drafted = statistics.mean(d for d, _ in counts[name])
    accepted = statistics.mean(a for _, a in counts[name])
    print(f"{name} / off: total {sum(times['off']) / sum(times[name]):.3f}x, median paired {statistics.median(ratios):.3f}x "
          f"({min(ratios):.3f}-{max(ratios):.3f}), per call {drafted:.1f} drafted, {accepted:.1f} accepted")
