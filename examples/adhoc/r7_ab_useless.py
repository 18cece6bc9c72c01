"""A/B on the reference model: round-7 timing fixes (first-of-shape skip + clipping) vs without, sampled useless cases."""
import random, statistics, sys, time, torch
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
import selfspec.verify_cost as vc
from selfspec.engine import SelfSpecModel
from selfspec.bench.settings import parse_args
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_texts, prompt_ids
from selfspec.bench.methods import random_heads

class AlwaysSeen(set):
    def __contains__(self, x): return True

settings = parse_args([]); loaded = load(settings, [])
model = loaded.model
kind, texts = prompt_texts(loaded.tokenizer, 4)
prompts = [p[0] for p in prompt_ids(loaded.tokenizer, texts, kind, 256, 96, "cpu")]
noise = random_heads(model, like=loaded.heads, seed=2)
cases = {
    "random heads": lambda: SelfSpecModel(model, "medusa", heads=noise),
    "early exit L1": lambda: SelfSpecModel(model, "early_exit", exit_layer=1),
    "fresh": None,
}
def make(case, old):
    def build():
        s = SelfSpecModel(model, heads=loaded.heads_dir, tokenizer=loaded.tokenizer) if case == "fresh" else cases[case]()
        if old: s._timed_shapes = AlwaysSeen()
        return s
    if case == "fresh":
        return lambda: build()  # built per call
    s = build(); return lambda: s
off = SelfSpecModel(model, drafter="none")
rng = random.Random(0)
for case in cases:
    variants = {"off": lambda: off, "new": make(case, False), "old": make(case, True)}
    for v in variants.values():  # warm-up
        v().generate(prompts[0][-32:], max_new_tokens=32, do_sample=True, temperature=0.7, top_p=0.9, eos_token_id=[])
    times = {k: [] for k in variants}
    for rnd in range(8):
        for i, p in enumerate(prompts):
            order = list(variants); rng.shuffle(order)
            for name in order:
                vc.OUTLIER_RATIO = 1e9 if name == "old" else 3.0
                torch.manual_seed(rnd * 100 + i)
                t = time.perf_counter()
                variants[name]().generate(p, max_new_tokens=96, do_sample=True, temperature=0.7, top_p=0.9, eos_token_id=[])
                times[name].append(time.perf_counter() - t)
    tot = {k: sum(v) for k, v in times.items()}
    print(f"{case:14s} new/off {tot['off']/tot['new']:.3f}x  old/off {tot['off']/tot['old']:.3f}x  "
          f"median paired new {statistics.median(o/n for o, n in zip(times['off'], times['new'])):.3f} "
          f"old {statistics.median(o/n for o, n in zip(times['off'], times['old'])):.3f}", flush=True)
