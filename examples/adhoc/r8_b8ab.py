"""Batch A/B: transformers batched vs selfspec "auto" with rows told what their drafter was asked for (round 8) vs
without (round 7)."""
import time, torch, sys, statistics, random
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
from selfspec.loading import load_model, load_tokenizer
from selfspec.engine import SelfSpecModel
from selfspec.bench.prompts import prompt_ids, prompt_texts
from selfspec.bench.batch import transformers_batched, BatchBenchSettings
import selfspec.batch_draft_length as bdl
import selfspec.draft_length as dl
M, H = sys.argv[1], sys.argv[2]
B, N, R = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
model = load_model(M); tok = load_tokenizer(M)
kind, texts = prompt_texts(tok, 16)
pool = prompt_ids(tok, texts, kind, 8192, N, "cpu")[:B]
spec = SelfSpecModel(model, heads=H, tokenizer=tok)
eos = tok.eos_token_id
settings = BatchBenchSettings(model=M, max_new_tokens=N)
spec.generate([p[0] for p in pool[:2]], max_new_tokens=8)
transformers_batched(model, pool[:2], settings, eos, eos)
OLD = [False]
observe = dl.AdaptiveDraftLength.observe
def obs(self, d, a, seconds=None, asked=None):
    return observe(self, d, a, seconds, None if OLD[0] else asked)
dl.AdaptiveDraftLength.observe = obs
res, rng = {}, random.Random(0)
for rnd in range(R):
    order = ["hf", "new", "old"]; rng.shuffle(order)
    for k in order:
        OLD[0] = k == "old"
        t = time.perf_counter()
        if k == "hf":
            out = transformers_batched(model, pool, settings, eos, eos); n = sum(len(x) for x in out.new_tokens); extra = ""
        else:
            out = spec.generate([p[0] for p in pool], max_new_tokens=N, eos_token_id=eos)
            n = sum(s.shape[0] - p.shape[1] for s, p in zip(out.sequences, pool))
            extra = f"fwd {out.stats.target_forwards} drafted {out.stats.drafted} acc {out.stats.accepted}"
        dt = time.perf_counter() - t
        res.setdefault(k, []).append(dt)
        print(rnd, k, f"{dt:.2f}s", n, extra, flush=True)
for k in ("new", "old"):
    print(k, "vs hf (paired median):", f"{statistics.median(h / x for h, x in zip(res['hf'], res[k])):.3f}x")
print("new vs old:", f"{statistics.median(o / x for o, x in zip(res['old'], res['new'])):.3f}x")
