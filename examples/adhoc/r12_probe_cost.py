"""Round 12 (AMD EPYC): what one early-exit probe scored in shadow costs SmolLM2 (layer 8 of 30), in one-token
decodes: a policy that probes on every step against speculation off, 64 tokens, 4 paired runs. Before the probe token
skipped its pass over the first layers (DraftContext.probe): 0.38; after: 0.20 (the exit LM head, mostly).
Usage: python examples/adhoc/r12_probe_cost.py"""
import time, torch, statistics
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
from selfspec.engine import SelfSpecModel
from selfspec.draft_length import AdaptiveDraftLength
from selfspec.bench.settings import parse_args
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_texts, prompt_ids
loaded = load(parse_args(["--model", "smollm2", "--heads", "none", "--eagle", "none"]), [])
kind, texts = prompt_texts(loaded.tokenizer, 2)
p = [x[0] for x in prompt_ids(loaded.tokenizer, texts, kind, 2048, 64, "cpu")][0]
off, early = SelfSpecModel(loaded.model, drafter="none"), SelfSpecModel(loaded.model, drafter="early_exit", exit_layer=8)
class AlwaysProbe(AdaptiveDraftLength):
    def choose(self):
        self.probes.probing = True; self._last_asked = 1; return 1
    def probe_in_shadow(self, full_forward=True): return True
kw = dict(max_new_tokens=64, eos_token_id=[])
res = {"off": [], "probe": []}
for r in range(4):
    t = time.perf_counter(); off.generate(p, num_draft_tokens=0, **kw); res["off"].append(time.perf_counter() - t)
    t = time.perf_counter(); o = early.generate(p, num_draft_tokens=AlwaysProbe(early.verify_cost()), **kw); res["probe"].append(time.perf_counter() - t)
print(o.stats.probed, "probes;", "per probe extra in decodes:", statistics.median([(b - a) / a for a, b in zip(res["off"], res["probe"])]) * 64 / 63)
