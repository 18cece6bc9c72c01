"""Paired A/B on SmolLM2, one thread: min_gain 0.02 vs 0 under "auto", for the random drafter and the EAGLE head
(greedy), with speculation off in every round. Fresh wrapper per call is not used: one wrapper per variant."""
import statistics, sys, time, torch
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
import selfspec.draft_length as dl
from selfspec.engine import SelfSpecModel
from selfspec.bench.settings import parse_args
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_texts, prompt_ids
from selfspec.bench.methods import RandomDrafter
settings = parse_args(["--model", "smollm2", "--heads", "examples/smollm2/heads", "--eagle", "examples/smollm2/eagle"])
loaded = load(settings, [])
model, tok = loaded.model, loaded.tokenizer
kind, texts = prompt_texts(tok, 4)
prompts = [p[0] for p in prompt_ids(tok, texts, kind, 2048, 128, "cpu")]
orig = dl.AdaptiveDraftLength.__init__
GAIN = {"g": 0.02}
def init(self, *a, **k):
    k.setdefault("min_gain", GAIN["g"]); orig(self, *a, **k)
dl.AdaptiveDraftLength.__init__ = init
off = SelfSpecModel(model, drafter="none", tokenizer=tok)
for case in sys.argv[2:]:
    spec = SelfSpecModel(model, drafter=RandomDrafter(model.config.vocab_size), tokenizer=tok) if case == "random" \
        else SelfSpecModel(model, heads=loaded.eagle, tokenizer=tok)
    spec.generate(prompts[0][-32:], max_new_tokens=16)
    t = {"new": [], "old": [], "off": []}
    for i in range(int(sys.argv[1])):
        p = prompts[i % len(prompts)]
        order = ["new", "old", "off"] if i % 2 == 0 else ["old", "off", "new"]
        for v in order:
            GAIN["g"] = 0.02 if v == "new" else 0.0
            s = off if v == "off" else spec
            start = time.perf_counter()
            s.generate(p, max_new_tokens=128, eos_token_id=[], num_draft_tokens=0 if v == "off" else "auto")
            t[v].append(time.perf_counter() - start)
    r = lambda a, b: statistics.median([x / y for x, y in zip(t[a], t[b])])
    print(f"{case}: new vs old {r('old', 'new'):.3f}, new vs off {r('off', 'new'):.3f}, old vs off {r('off', 'old'):.3f}", flush=True)
