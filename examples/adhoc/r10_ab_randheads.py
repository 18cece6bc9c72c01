"""Paired A/B (SmolLM2, or the reference model): random (untrained) Medusa heads at default settings vs speculation off, sampled (T=0.7,
top-p 0.9), the row the round-10 useless benchmark missed (0.93x, 0.90-1.01 over 3 rounds). Also counts the steps
that asked the heads. Usage: python examples/adhoc/r10_ab_randheads.py ROUNDS [smollm2|reference]"""
import random, statistics, sys, time, torch
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
from selfspec.engine import SelfSpecModel
from selfspec.bench.settings import parse_args
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_texts, prompt_ids
from selfspec.bench.methods import random_heads

smol = (sys.argv[2] if len(sys.argv) > 2 else "smollm2") == "smollm2"
settings = parse_args(["--model", "smollm2", "--heads", "examples/smollm2/heads", "--eagle", "none"] if smol else [])
loaded = load(settings, [])
model = loaded.model
kind, texts = prompt_texts(loaded.tokenizer, 2 if smol else 4)
prompts = [p[0] for p in prompt_ids(loaded.tokenizer, texts, kind, 2048 if smol else 256, 128 if smol else 96, "cpu")]
variants = {"off": SelfSpecModel(model, drafter="none"),
            "random heads": SelfSpecModel(model, "medusa", heads=random_heads(model, like=loaded.heads, seed=2))}
kw = dict(max_new_tokens=128 if smol else 96, do_sample=True, temperature=0.7, top_p=0.9, eos_token_id=[])
for v in variants.values():  # warm-up (and the cost curve, if not on disk yet)
    v.generate(prompts[0][-32:], **{**kw, "max_new_tokens": 32})
rng, times, drafted = random.Random(0), {k: [] for k in variants}, []
for rnd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 6):
    for i, p in enumerate(prompts):
        order = list(variants); rng.shuffle(order)
        for name in order:
            torch.manual_seed(rnd * 100 + i)
            t = time.perf_counter()
            out = variants[name].generate(p, **kw)
            times[name].append(time.perf_counter() - t)
            if name != "off":
                drafted.append(out.stats.drafted)
ratios = [o / n for o, n in zip(times["off"], times["random heads"])]
print(f"random heads / off: total {sum(times['off']) / sum(times['random heads']):.3f}x, median paired "
      f"{statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f}), drafts per call {statistics.mean(drafted):.1f}")
