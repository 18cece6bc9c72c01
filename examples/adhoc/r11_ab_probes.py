"""Paired, interleaved A/B (round 11, AMD EPYC): random (untrained) Medusa heads sampled (T=0.7, top-p 0.9) at the
default "auto" and at a fixed k = 0, speculation off, and plain generate, on 4 prompts (reference) or N (SmolLM2) x 96
tokens. Before probes were scored in shadow (0b59ece) SmolLM2 ran "auto" at 0.925x of speculation off; after (1928a62)
1.022x. Usage: python examples/adhoc/r11_ab_probes.py ROUNDS reference|smollm2 [NUM_PROMPTS]"""
import random, statistics, sys, time, torch
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
from selfspec.engine import SelfSpecModel
from selfspec.bench.settings import parse_args
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_texts, prompt_ids
from selfspec.bench.methods import random_heads
smol = sys.argv[2] == "smollm2"
settings = parse_args(["--model", "smollm2", "--heads", "examples/smollm2/heads", "--eagle", "none"] if smol else [])
loaded = load(settings, []); model = loaded.model
kind, texts = prompt_texts(loaded.tokenizer, int(sys.argv[3]) if len(sys.argv) > 3 else 4)
prompts = [p[0] for p in prompt_ids(loaded.tokenizer, texts, kind, 2048 if smol else 256, 96, "cpu")]
rh = SelfSpecModel(model, "medusa", heads=random_heads(model, like=loaded.heads, seed=2))
off = SelfSpecModel(model, drafter="none")
variants = {"off": (off, "auto"), "rh k=0": (rh, 0), "rh auto": (rh, "auto"), "generate": None}
kw = dict(max_new_tokens=96, do_sample=True, temperature=0.7, top_p=0.9, eos_token_id=[])
for v in (off, rh): v.generate(prompts[0][-32:], **{**kw, "max_new_tokens": 32})
rng, times = random.Random(0), {k: [] for k in variants}
for rnd in range(int(sys.argv[1])):
    for i, p in enumerate(prompts):
        order = list(variants); rng.shuffle(order)
        for name in order:
            torch.manual_seed(rnd * 100 + i); t = time.perf_counter()
            if variants[name] is None:
                model.generate(p[None], pad_token_id=0, top_k=None, **kw)
            else:
                s, k = variants[name]; s.generate(p, num_draft_tokens=k, **kw)
            times[name].append(time.perf_counter() - t)
for name in variants:
    r = [o / n for o, n in zip(times["off"], times[name])]
    print(f"{name:9s} off/this total {sum(times['off']) / sum(times[name]):.3f}x median {statistics.median(r):.3f}")
