"""Reference model, weak Medusa heads at T=1: off vs auto (per-k residuals) vs auto with residuals off, paired."""
import random, statistics, sys, time, torch
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
import selfspec.verify_cost as vc
from selfspec.engine import SelfSpecModel
from selfspec.bench.settings import parse_args
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_texts, prompt_ids
ROUNDS = int(sys.argv[1]); T = float(sys.argv[2])
settings = parse_args([]); loaded = load(settings, [])
model = loaded.model
kind, texts = prompt_texts(loaded.tokenizer, 4)
prompts = [p[0] for p in prompt_ids(loaded.tokenizer, texts, kind, 256, 96, "cpu")]
OLD = [False]
res = vc.LearnedVerifyCost.residual
vc.LearnedVerifyCost.residual = lambda self, k: 0.0 if OLD[0] else res(self, k)
off = SelfSpecModel(model, drafter="none")
new, old = (SelfSpecModel(model, heads=loaded.heads_dir, tokenizer=loaded.tokenizer) for _ in range(2))
kw = dict(max_new_tokens=96, do_sample=True, temperature=T, eos_token_id=[])
variants = {"off": off, "new": new, "old": old}
for n, s in variants.items():
    OLD[0] = n == "old"; s.generate(prompts[0][-32:], **{**kw, "max_new_tokens": 32})
rng = random.Random(0); times = {k: [] for k in variants}; st = {k: [0, 0] for k in variants}
for rnd in range(ROUNDS):
    for i, p in enumerate(prompts):
        order = list(variants); rng.shuffle(order)
        for n in order:
            OLD[0] = n == "old"; torch.manual_seed(rnd * 100 + i)
            t = time.perf_counter(); out = variants[n].generate(p, **kw); times[n].append(time.perf_counter() - t)
            st[n][0] += out.stats.drafted; st[n][1] += out.stats.accepted
for n in variants:
    print(n, f"vs off {statistics.median(o / x for o, x in zip(times['off'], times[n])):.3f}", "drafted/accepted", st[n])
