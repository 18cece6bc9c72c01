"""Batch A/B: transformers batched vs selfspec auto (round-8 probe rule) vs auto with round 7's (accepted probes keep the wait)."""
import time, torch, sys, statistics, random
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
from selfspec.loading import load_model, load_tokenizer
from selfspec.engine import SelfSpecModel
from selfspec.bench.prompts import prompt_ids, prompt_texts
from selfspec.bench.batch import transformers_batched, BatchBenchSettings
import selfspec.draft_length as dl
M, H, N, R = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]); sizes = [int(x) for x in sys.argv[5].split(",")]
model = load_model(M); tok = load_tokenizer(M)
kind, texts = prompt_texts(tok, 16)
pool = prompt_ids(tok, texts, kind, 8192, N, "cpu")
spec = SelfSpecModel(model, heads=H, tokenizer=tok)
eos = tok.eos_token_id
settings = BatchBenchSettings(model=M, max_new_tokens=N)
spec.generate([p[0][-16:] for p in pool[:2]], max_new_tokens=8)
transformers_batched(model, [p[:, -16:] for p in pool[:2]], settings, eos, eos)
OLD = [False]
observed = dl.ProbeSchedule.observed
def obs(self, n):
    keep = self.accepted_keeps_wait
    if OLD[0]: self.accepted_keeps_wait = True
    observed(self, n); self.accepted_keeps_wait = keep
dl.ProbeSchedule.observed = obs
rng = random.Random(0)
for B in sizes:
    prompts = [pool[i % len(pool)] for i in range(B)]
    res = {}
    for rnd in range(R):
        order = ["hf", "new", "old"]; rng.shuffle(order)
        for k in order:
            OLD[0] = k == "old"
            t = time.perf_counter()
            if k == "hf":
                transformers_batched(model, prompts, settings, eos, eos); extra = ""
            else:
                out = spec.generate([p[0] for p in prompts], max_new_tokens=N, eos_token_id=eos)
                extra = f"fwd {out.stats.target_forwards} drafted {out.stats.drafted} acc {out.stats.accepted}"
            dt = time.perf_counter() - t
            res.setdefault(k, []).append(dt)
            print(B, rnd, k, f"{dt:.2f}s", extra, flush=True)
    print(f"batch {B}: new vs hf {statistics.median(h / x for h, x in zip(res['hf'], res['new'])):.3f}x, old vs hf "
          f"{statistics.median(h / x for h, x in zip(res['hf'], res['old'])):.3f}x, new vs old "
          f"{statistics.median(o / x for o, x in zip(res['old'], res['new'])):.3f}x", flush=True)
