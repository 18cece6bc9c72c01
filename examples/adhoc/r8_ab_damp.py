"""Medusa (good heads) on the reference model: off vs resume (full) vs resume damped (evidence capped at W) vs afresh."""
import random, statistics, sys, time, torch
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
import selfspec.draft_length as dl
from selfspec.engine import SelfSpecModel
from selfspec.bench.settings import parse_args
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_texts, prompt_ids
ROUNDS, W = int(sys.argv[1]), float(sys.argv[2]); args = sys.argv[3:]
settings = parse_args(args); loaded = load(settings, [])
model = loaded.model
kind, texts = prompt_texts(loaded.tokenizer, 4)
N = settings.max_new_tokens
prompts = [p[0] for p in prompt_ids(loaded.tokenizer, texts, kind, 256, N, "cpu")]
full_resume = dl.AdaptiveDraftLength.resume
def damped(self, earlier):
    full_resume(self, earlier)
    for i in range(len(self.tried)):
        total = self.tried[i] + self.prior_left[i]
        if total > W:
            f = W / total
            self.tried[i] *= f; self.accepted[i] *= f; self.prior_left[i] *= f
    if self.asked + 1 > W:
        f = W / (self.asked + 1); self.asked *= f; self.declined *= f
build = lambda: SelfSpecModel(model, heads=loaded.heads_dir, tokenizer=loaded.tokenizer)
off = SelfSpecModel(model, drafter="none")
rng = random.Random(1)
for mode, kw in (("greedy", {}), ("sampled", dict(do_sample=True, temperature=0.7, top_p=0.9))):
    kw = dict(max_new_tokens=N, eos_token_id=[], **kw)
    variants = {"off": off, "resume": build(), "damped": build(), "afresh": build()}
    variants["afresh"]._resumed = lambda policy, options: policy
    for s in variants.values():
        s.generate(prompts[0][-32:], **{**kw, "max_new_tokens": 32})
    times = {k: [] for k in variants}; drafted = {k: 0 for k in variants}; acc = {k: 0 for k in variants}
    for rnd in range(ROUNDS):
        for i, p in enumerate(prompts):
            order = list(variants); rng.shuffle(order)
            for name in order:
                dl.AdaptiveDraftLength.resume = damped if name == "damped" else full_resume
                torch.manual_seed(rnd * 100 + i)
                t = time.perf_counter(); out = variants[name].generate(p, **kw); times[name].append(time.perf_counter() - t)
                drafted[name] += out.stats.drafted; acc[name] += out.stats.accepted
    print(mode, " ".join(f"{k}/off {statistics.median(o/n for o, n in zip(times['off'], times[k])):.3f}" for k in variants if k != "off"),
          "drafted", drafted, "accepted", acc, flush=True)
