import time, torch, sys, statistics
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
from selfspec.loading import load_model, load_tokenizer
from selfspec.engine import SelfSpecModel
from selfspec.bench.prompts import prompt_ids, prompt_texts
from selfspec.bench.batch import transformers_batched, BatchBenchSettings
import selfspec.batch_draft_length as bdl
model = load_model("smollm2"); tok = load_tokenizer("smollm2")
B = int(sys.argv[1]) if len(sys.argv) > 1 else 8
N = int(sys.argv[2]) if len(sys.argv) > 2 else 64
kind, texts = prompt_texts(tok, 16)
pool = prompt_ids(tok, texts, kind, 8192, N, "cpu")[:B]
spec = SelfSpecModel(model, heads="/work/main/examples/smollm2/eagle", tokenizer=tok)
eos = tok.eos_token_id
settings = BatchBenchSettings(model="smollm2", max_new_tokens=N)
spec.generate([p[0] for p in pool[:2]], max_new_tokens=8)
ws = []
orig = bdl.BatchDraftLength.choose
def choose(self, rows):
    w = orig(self, rows); ws.append(w); return w
bdl.BatchDraftLength.choose = choose
res = {}
for rnd in range(2):
    for k in ("hf", 0, 1, 2, "auto"):
        ws.clear()
        t = time.perf_counter()
        if k == "hf":
            out = transformers_batched(model, pool, settings, eos, eos); n = sum(len(x) for x in out.new_tokens); extra = ""
        else:
            out = spec.generate([p[0] for p in pool], max_new_tokens=N, num_draft_tokens=k, eos_token_id=eos)
            n = sum(s.shape[0] - p.shape[1] for s, p in zip(out.sequences, pool))
            extra = f"fwd {out.stats.num_forwards if hasattr(out.stats,'num_forwards') else ''} tpf {out.stats.tokens_per_forward:.2f} " + "".join(map(str, ws))
        dt = time.perf_counter() - t
        res.setdefault(k, []).append(n / dt)
        print(rnd, k, f"{dt:.2f}s", n, extra, flush=True)
hf = statistics.median(res["hf"])
for k, v in res.items(): print(k, f"{statistics.median(v)/hf:.3f}x")
