"""Paired, interleaved A/B (round 11, AMD EPYC): SmolLM2 early exit at layer 8 (untrained for it), greedy, default
"auto": its probes scored in shadow (the library since this commit) vs verified for real (the same policy with
`probe_in_shadow` returning False: the library before), vs speculation off. The useless-drafts benchmark's greedy
early-exit row read 0.94x of speculation off at 1928a62 (0.99x in round 10).
Usage: python examples/adhoc/r11_ab_early_exit.py ROUNDS [NUM_PROMPTS]"""
import random, statistics, sys, time, torch
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
from selfspec.engine import SelfSpecModel
from selfspec.draft_length import AdaptiveDraftLength
from selfspec.bench.settings import parse_args
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_texts, prompt_ids

loaded = load(parse_args(["--model", "smollm2", "--heads", "none", "--eagle", "none"]), [])
model = loaded.model
kind, texts = prompt_texts(loaded.tokenizer, int(sys.argv[2]) if len(sys.argv) > 2 else 2)
prompts = [p[0] for p in prompt_ids(loaded.tokenizer, texts, kind, 2048, 96, "cpu")]
off, early = SelfSpecModel(model, drafter="none"), SelfSpecModel(model, drafter="early_exit", exit_layer=8)


class RealProbes(AdaptiveDraftLength):
    def probe_in_shadow(self, full_forward=True):
        return False


def real_probes():
    return RealProbes(early.verify_cost(), draft_cost=early.drafter.draft_cost)


variants = {"off": lambda p: off.generate(p, **kw), "shadow": lambda p: early.generate(p, **kw),
            "real": lambda p: early.generate(p, num_draft_tokens=real_probes(), **kw)}
kw = dict(max_new_tokens=96, do_sample=False, eos_token_id=[])
for run in variants.values():
    run(prompts[0][-32:])
rng, times, probed = random.Random(0), {k: [] for k in variants}, {k: [] for k in variants}
for rnd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    for p in prompts:
        order = list(variants); rng.shuffle(order)
        for name in order:
            t = time.perf_counter()
            out = variants[name](p)
            times[name].append(time.perf_counter() - t)
            probed[name].append((out.stats.drafted, out.stats.probed))
for name in variants:
    r = [o / n for o, n in zip(times["off"], times[name])]
    print(f"{name:7s} vs off: total {sum(times['off']) / sum(times[name]):.3f}x, median pair {statistics.median(r):.3f}x "
          f"({min(r):.3f}-{max(r):.3f}); (drafted, probed in shadow) per call {probed[name][:4]}")
