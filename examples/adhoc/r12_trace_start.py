"""Round 12 (AMD EPYC): where a useless drafter's time goes under default "auto": per step of one 128-token
generation, the k chosen, drafted / accepted, whether it was a probe scored in shadow, and the step's time in
one-token decodes. Usage: python examples/adhoc/r12_trace_start.py MODEL {early_exit,random} [GENERATIONS]"""
import sys, torch
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
import selfspec.draft_length as dl
from selfspec.engine import SelfSpecModel
from selfspec.bench.settings import parse_args
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_texts, prompt_ids
from selfspec.bench.methods import RandomDrafter

loaded = load(parse_args(["--model", "examples/reference/model" if sys.argv[1] == "reference" else sys.argv[1], "--heads", "none", "--eagle", "none"]), [])
kind, texts = prompt_texts(loaded.tokenizer, 4)
prompts = [p[0] for p in prompt_ids(loaded.tokenizer, texts, kind, 2048, 128, "cpu")]
if sys.argv[2] == "early_exit":
    spec = SelfSpecModel(loaded.model, drafter="early_exit", exit_layer=8 if sys.argv[1] == "smollm2" else 3)
else:
    spec = SelfSpecModel(loaded.model, drafter=RandomDrafter(loaded.model.config.vocab_size))
off = SelfSpecModel(loaded.model, drafter="none")
off.generate(prompts[0][-32:], max_new_tokens=16)
log = []
orig = dl.AdaptiveDraftLength.observe
def observe(self, d, a, seconds=None, asked=None):
    dec = self.cost_curve.decode_seconds
    log.append((self._last_asked, d, a, self.probes.probing, None if seconds is None or not dec else round(seconds / dec, 2)))
    return orig(self, d, a, seconds, asked)
dl.AdaptiveDraftLength.observe = observe
for g in range(int(sys.argv[3]) if len(sys.argv) > 3 else 2):
    log.clear()
    out = spec.generate(prompts[1 + g % 3], max_new_tokens=128, eos_token_id=[])
    base = off.generate(prompts[1 + g % 3], max_new_tokens=128, eos_token_id=[])
    print(f"generation {g}: {base.stats.seconds / out.stats.seconds:.3f}x of off; drafted {out.stats.drafted}, "
          f"accepted {out.stats.accepted}, probed {out.stats.probed}")
    print("  (asked, drafted, accepted, probe, decodes) for steps that asked:",
          [(i, e) for i, e in enumerate(log) if e[0]])
