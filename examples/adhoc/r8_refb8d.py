import time, torch, sys
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
from selfspec.loading import load_model, load_tokenizer
from selfspec.engine import SelfSpecModel
from selfspec.bench.prompts import prompt_ids, prompt_texts
from selfspec.bench.batch import transformers_batched, selfspec_batch, selfspec_one_by_one, BatchBenchSettings
import selfspec.batch_draft_length as bdl
M = "/work/main/examples/reference/model"
model = load_model(M); tok = load_tokenizer(M)
kind, texts = prompt_texts(tok, 16)
pool = prompt_ids(tok, texts, kind, 8192, 96, "cpu")
spec = SelfSpecModel(model, heads="/work/main/examples/reference/heads", tokenizer=tok)
eos = tok.eos_token_id
s = BatchBenchSettings(model=M, max_new_tokens=96)
ws = []
orig = bdl.BatchDraftLength.choose
def ch(self, rows):
    w = orig(self, rows); ws.append(w); return w
bdl.BatchDraftLength.choose = ch
for r in range(3):
    for b in (8, 16):
        prompts = [pool[i % len(pool)] for i in range(b)]
        selfspec_one_by_one(spec, prompts, s, eos)
        ws.clear(); out = selfspec_batch(spec, prompts, s, eos)
        print(r, b, f"{out.seconds:.2f}", "".join(map(str, ws))[:100], [round(x, 2) for x in spec.verify_cost().relative], flush=True)
