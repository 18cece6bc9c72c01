"""Reference batch 8: does selfspec's batch slow down round by round, and is it the planner, gc, or steps?"""
import gc, sys, time, torch
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
from selfspec.loading import load_model, load_tokenizer
from selfspec.engine import SelfSpecModel
from selfspec.bench.prompts import prompt_ids, prompt_texts
from selfspec.bench.batch import transformers_batched, selfspec_batch, selfspec_one_by_one, BatchBenchSettings
from dataclasses import replace
M = "examples/reference/model"
model = load_model(M); tok = load_tokenizer(M)
kind, texts = prompt_texts(tok, 16)
pool = prompt_ids(tok, texts, kind, 8192, 96, "cpu")
spec = SelfSpecModel(model, heads="examples/reference/heads", tokenizer=tok)
eos = tok.eos_token_id
s = BatchBenchSettings(model=M, max_new_tokens=96)
s0 = replace(s, num_draft_tokens="0")
gct = [0.0, 0]
def cb(phase, info, t=[0.0]):
    if phase == "start": t[0] = time.perf_counter()
    else: gct[0] += time.perf_counter() - t[0]; gct[1] += 1
gc.callbacks.append(cb)
prompts = [pool[i % len(pool)] for i in range(8)]
for m in ("b", "h", "o"):
    pass
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 6):
    row = []
    for name, f in (("auto", lambda: selfspec_batch(spec, prompts, s, eos)), ("k0", lambda: selfspec_batch(spec, prompts, s0, eos)),
                    ("hf", lambda: transformers_batched(model, prompts, s, eos, eos)), ("1by1", lambda: selfspec_one_by_one(spec, prompts, s, eos))):
        gct[:] = [0.0, 0]
        out = f()
        row.append(f"{name} {out.seconds:.3f}s gc {gct[0]*1e3:.0f}ms/{gct[1]}")
    print(r, " | ".join(row), "objs", len(gc.get_objects()), flush=True)
