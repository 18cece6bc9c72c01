"""Paired, interleaved A/B (round 11, AMD EPYC): the reference model with the random drafter, greedy, default "auto":
probes scored in shadow (the library since 1928a62) vs verified for real (the same policy with `probe_in_shadow`
returning False), vs speculation off; 4 prompts x 96 tokens. The useless-drafts benchmark's greedy random-drafts row
read 0.94x (0.90-0.96) of speculation off at c0833b7 (round 10: 0.98x).
Usage: python examples/adhoc/r11_ab_random.py ROUNDS"""
import random, statistics, sys, time, torch
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
from selfspec.engine import SelfSpecModel
from selfspec.draft_length import AdaptiveDraftLength
from selfspec.bench.settings import parse_args
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_texts, prompt_ids
from selfspec.bench.methods import RandomDrafter

loaded = load(parse_args([]), [])
model = loaded.model
kind, texts = prompt_texts(loaded.tokenizer, 4)
prompts = [p[0] for p in prompt_ids(loaded.tokenizer, texts, kind, 256, 96, "cpu")]
off = SelfSpecModel(model, drafter="none")
drafted = SelfSpecModel(model, RandomDrafter(model.config.vocab_size, 0))


class RealProbes(AdaptiveDraftLength):
    def probe_in_shadow(self, full_forward=True):
        return False


kw = dict(max_new_tokens=96, do_sample=False, eos_token_id=[])
variants = {"off": lambda p: off.generate(p, **kw), "shadow": lambda p: drafted.generate(p, **kw),
            "real": lambda p: drafted.generate(p, num_draft_tokens=RealProbes(drafted.verify_cost()), **kw),
            "k=0": lambda p: drafted.generate(p, num_draft_tokens=0, **kw)}
for run in variants.values():
    run(prompts[0][-32:])
rng, times, counts = random.Random(0), {k: [] for k in variants}, {k: [] for k in variants}
for rnd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 6):
    for p in prompts:
        order = list(variants); rng.shuffle(order)
        for name in order:
            t = time.perf_counter()
            out = variants[name](p)
            times[name].append(time.perf_counter() - t)
            counts[name].append((out.stats.drafted, out.stats.probed))
for name in variants:
    r = [o / n for o, n in zip(times["off"], times[name])]
    print(f"{name:7s} vs off: total {sum(times['off']) / sum(times[name]):.3f}x, median pair {statistics.median(r):.3f}x "
          f"({min(r):.3f}-{max(r):.3f}); (drafted, probed in shadow) per call {counts[name][:4]}")
