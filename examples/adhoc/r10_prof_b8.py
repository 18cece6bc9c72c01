"""Reference batch 8: "auto" vs a fixed k = 0 vs transformers' batched generate, interleaved (ROUNDS), then a cProfile of
three runs of one of them (auto|k0) after warm-up. Usage: python examples/adhoc/r10_prof_b8.py ROUNDS [auto|k0]"""
import cProfile, pstats, sys, torch
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
from dataclasses import replace
from selfspec.loading import load_model, load_tokenizer
from selfspec.engine import SelfSpecModel
from selfspec.bench.prompts import prompt_ids, prompt_texts
from selfspec.bench.batch import selfspec_batch, transformers_batched, BatchBenchSettings
M = "examples/reference/model"
model = load_model(M); tok = load_tokenizer(M)
kind, texts = prompt_texts(tok, 16)
pool = prompt_ids(tok, texts, kind, 8192, 96, "cpu")
spec = SelfSpecModel(model, heads="examples/reference/heads", tokenizer=tok)
eos = tok.eos_token_id
s = BatchBenchSettings(model=M, max_new_tokens=96)
settings = {"auto": s, "k0": replace(s, num_draft_tokens="0")}
prompts = [pool[i % len(pool)] for i in range(8)]
for name in settings:
    selfspec_batch(spec, prompts, settings[name], eos)  # warm-up
times = {n: [] for n in list(settings) + ["hf"]}
for r in range(int(sys.argv[1])):
    for name in settings:
        times[name].append(selfspec_batch(spec, prompts, settings[name], eos).seconds)
    times["hf"].append(transformers_batched(model, prompts, s, eos, eos).seconds)
for n, t in times.items():
    t = sorted(t); print(n, "median %.3f" % t[len(t) // 2], " ".join("%.3f" % x for x in t))
if len(sys.argv) > 2:
    out = spec.generate([p[0] for p in prompts], max_new_tokens=96, num_draft_tokens="auto" if sys.argv[2] == "auto" else 0, eos_token_id=eos)
    st = out.stats; print("forwards", st.target_forwards, "new", st.new_tokens, "drafted", st.drafted, "accepted", st.accepted, "prefill", st.prefill_seconds, "decode", st.decode_seconds)
    pr = cProfile.Profile(); pr.enable()
    for _ in range(3):
        selfspec_batch(spec, prompts, settings[sys.argv[2]], eos)
    pr.disable()
    pstats.Stats(pr).sort_stats("cumulative").print_stats("selfspec|heads", 40)
