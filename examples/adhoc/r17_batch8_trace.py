"""Round 17 (AMD EPYC, one thread): the reference model's batch of B (default 8) code prompts, 96 tokens without EOS,
"auto" against a fixed k = 0 (and k = 1), each call in turn, R rounds: per "auto" call its time, the width it chose
at each step, the batch curve at 8 x 1 / 8 x 2 / 8 x 3 tokens with how often each total was timed, and the planner's
measured rates per width at the end (tokens per second, decayed steps); then medians. Round 17's batch benchmark had
"auto" at 1.00x of transformers' batched loop at batch 8 and no drafts at 1.21x.
Usage: python examples/adhoc/r17_batch8_trace.py ROUNDS [B]"""
import statistics
import sys
import time

import torch
import transformers

import selfspec.batch_draft_length as bdl
from selfspec.bench.prompts import prompt_ids, prompt_texts
from selfspec.engine import SelfSpecModel
from selfspec.loading import load_model, load_tokenizer

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
MODEL = "examples/reference/model"
model, tokenizer = load_model(MODEL), load_tokenizer(MODEL)
kind, texts = prompt_texts(tokenizer, 16)
pool = prompt_ids(tokenizer, texts, kind, 8192, 96, "cpu")
spec = SelfSpecModel(model, heads="examples/reference/heads", tokenizer=tokenizer)
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 8
prompts = [pool[i % len(pool)][0] for i in range(batch)]
widths, planners = [], []
choose, init = bdl.BatchDraftLength.choose, bdl.BatchDraftLength.__init__


def logged_init(self, *args, **kwargs):
    init(self, *args, **kwargs)
    planners.append(self)


def logged_choose(self, rows):
    width = choose(self, rows)
    widths.append(width)
    return width


bdl.BatchDraftLength.__init__, bdl.BatchDraftLength.choose = logged_init, logged_choose
kw = dict(max_new_tokens=96, eos_token_id=[])
variants = {"auto": {}, "k0": dict(num_draft_tokens=0), "k1": dict(num_draft_tokens=1)}
spec.generate([p[-16:] for p in prompts[:2]], **kw)  # warm-up
times = {name: [] for name in variants}
for r in range(int(sys.argv[1])):
    for name, extra in variants.items():
        widths.clear()
        planners.clear()
        started = time.perf_counter()
        out = spec.generate(prompts, **kw, **extra)
        times[name].append(time.perf_counter() - started)
        if name == "auto":
            curve, planner = spec.batch_verify_cost(), planners[-1]
            totals = [batch * (1 + w) - 1 for w in (0, 1, 2)]
            rates = {w: (round(v[1] / v[2]), round(v[0], 1)) for (rows, w), v in sorted(planner.measured.items())
                     if rows == batch and v[2] > 0}
            print(r, f"{times[name][-1]:.2f}s", "".join(map(str, widths)),
                  "tpf", round(out.stats.tokens_per_forward, 2),
                  "curve", [round(curve(n), 2) for n in totals], "timed", [curve.timed[n] for n in totals],
                  "rates (tok/s, steps) by width", rates, flush=True)
for name in variants:
    print(name, f"median {statistics.median(times[name]):.2f}s",
          f"k0 / this {statistics.median(times['k0']) / statistics.median(times[name]):.2f}x")
