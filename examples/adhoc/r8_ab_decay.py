"""SmolLM2 EAGLE greedy, paired: off, k=2, auto, auto whose step-overhead learner remembers ~50 steps (decay 0.98)."""
import random, statistics, sys, time, torch
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
import selfspec.draft_length as dl
from selfspec.engine import SelfSpecModel
from selfspec.bench.settings import parse_args
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_texts, prompt_ids
ROUNDS, DECAY = int(sys.argv[1]), float(sys.argv[2]); args = sys.argv[3:]
settings = parse_args(args); loaded = load(settings, [])
model = loaded.model
kind, texts = prompt_texts(loaded.tokenizer, 4)
N = settings.max_new_tokens
prompts = [p[0] for p in prompt_ids(loaded.tokenizer, texts, kind, 256, N, "cpu")]
heads = loaded.eagle if loaded.eagle is not None else loaded.heads_dir
spec = SelfSpecModel(model, heads=heads, tokenizer=loaded.tokenizer)
off = SelfSpecModel(model, drafter="none")
SLOW = [False]
init = dl.AdaptiveDraftLength.__init__
def patched(self, *a, **k):
    init(self, *a, **k)
    if SLOW[0]:
        self.overhead = dl.StepOverhead(DECAY, per_token=self.overhead.prior_per_token)
dl.AdaptiveDraftLength.__init__ = patched
kw = dict(max_new_tokens=N, eos_token_id=[])
variants = {"off": (off, 0), "k2": (spec, 2), "auto": (spec, "auto"), "slow": (spec, "auto")}
for s, k in variants.values():
    s.generate(prompts[0][-32:], **{**kw, "max_new_tokens": 32}, num_draft_tokens=k)
rng = random.Random(0)
times = {k: [] for k in variants}; st = {k: [0, 0, 0] for k in variants}
for rnd in range(ROUNDS):
    for i, p in enumerate(prompts):
        order = list(variants); rng.shuffle(order)
        for name in order:
            s, k = variants[name]; SLOW[0] = name == "slow"
            t = time.perf_counter(); out = s.generate(p, num_draft_tokens=k, **kw); times[name].append(time.perf_counter() - t)
            st[name][0] += out.stats.target_forwards; st[name][1] += out.stats.drafted; st[name][2] += out.stats.accepted
    print("round", rnd, {n: f"{statistics.median(o/x for o, x in zip(times['off'], times[n])):.3f}" for n in variants}, flush=True)
for name in variants:
    print(f"{name:5s} vs off {statistics.median(o/n for o, n in zip(times['off'], times[name])):.3f}  fwd/drafted/accepted {st[name]}")
