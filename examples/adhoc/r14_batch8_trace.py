"""Round 14 (AMD EPYC, one thread), at d4c6dcd: the reference model's batch of B (default 8) code prompts, 96 tokens
without EOS: "auto" (printing the planner's width per step, tokens per forward and the batch curve at 8 / 16 / 24 /
32 tokens in all, with how often each was timed) vs fixed k = 0, 1, 2 per row, each call in turn, medians. Measured
(3 rounds): "auto" mostly w = 0 with a one-draft probe every 8-32 steps, 0.92x of k = 0; k = 1 and k = 2 0.76x; the
curve 1.9 / 3.0 / 3.7 / 4.6 one-row decodes. Usage: python examples/adhoc/r14_batch8_trace.py ROUNDS [B]"""
import statistics, sys, time, torch
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
from selfspec.loading import load_model, load_tokenizer
from selfspec.engine import SelfSpecModel
from selfspec.bench.prompts import prompt_ids, prompt_texts
import selfspec.batch_draft_length as bdl
M = "examples/reference/model"
model = load_model(M); tok = load_tokenizer(M)
kind, texts = prompt_texts(tok, 16)
pool = prompt_ids(tok, texts, kind, 8192, 96, "cpu")
spec = SelfSpecModel(model, heads="examples/reference/heads", tokenizer=tok)
B = int(sys.argv[2]) if len(sys.argv) > 2 else 8
prompts = [pool[i % len(pool)][0] for i in range(B)]
ws = []
orig = bdl.BatchDraftLength.choose
def ch(self, rows):
    w = orig(self, rows); ws.append(w); return w
bdl.BatchDraftLength.choose = ch
kw = dict(max_new_tokens=96, eos_token_id=[])
variants = {"auto": {}, "k0": dict(num_draft_tokens=0), "k1": dict(num_draft_tokens=1), "k2": dict(num_draft_tokens=2)}
spec.generate([p[-16:] for p in prompts[:2]], **kw)
times = {k: [] for k in variants}
for r in range(int(sys.argv[1])):
    for name, extra in variants.items():
        ws.clear()
        t = time.perf_counter(); out = spec.generate(prompts, **kw, **extra); times[name].append(time.perf_counter() - t)
        if name == "auto":
            c = spec.batch_verify_cost()
            print(r, f"{times[name][-1]:.2f}s", "".join(map(str, ws)), "tpf", round(out.stats.tokens_per_forward, 2),
                  "curve@7,15,23,31:", [round(c(n), 2) for n in (7, 15, 23, 31)], "timed", [c.timed[n] for n in (7, 15, 23, 31)], flush=True)
for name in variants:
    print(name, f"median {statistics.median(times[name]):.2f}s", f"vs k0 {statistics.median(times['k0']) / statistics.median(times[name]):.2f}x")
