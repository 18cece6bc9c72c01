"""Round 14 (AMD EPYC, one thread): SmolLM2, 64 new tokens greedy after a 100-token prompt: plain `generate` vs
selfspec with speculation off (drafter="none", the few-row kernel on by default: one-row products stay on F.linear),
interleaved, medians; then a cProfile of one selfspec call (where its time goes). Measured: speculation off 1.07x of
generate, 4 rounds. Usage: python examples/adhoc/r14_off_vs_generate.py ROUNDS"""
import cProfile, pstats, statistics, sys, time, torch
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
from selfspec import SelfSpecModel
from selfspec.loading import load_model, load_tokenizer
model = load_model("smollm2"); tok = load_tokenizer("smollm2")
off = SelfSpecModel(model, drafter="none", tokenizer=tok)
ids = torch.arange(100)[None] % 1000 + 200
n = 64
def gen():
    return model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
def spec():
    return off.generate(ids[0], max_new_tokens=n, eos_token_id=[])
gen(); spec()
t = {"gen": [], "off": []}
for r in range(int(sys.argv[1])):
    for name, f in (("gen", gen), ("off", spec)):
        s = time.perf_counter(); f(); t[name].append(time.perf_counter() - s)
print({k: round(statistics.median(v), 3) for k, v in t.items()},
      "off/gen speed", statistics.median(t["gen"]) / statistics.median(t["off"]))
cProfile.run("spec()", "/tmp/off.prof")
pstats.Stats("/tmp/off.prof").sort_stats("tottime").print_stats(25)
