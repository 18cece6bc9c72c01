import sys, torch
torch.set_num_threads(1)
import transformers; transformers.logging.set_verbosity_error()
import selfspec.draft_length as dl
from selfspec.engine import SelfSpecModel
from selfspec.bench.settings import parse_args
from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_texts, prompt_ids
settings = parse_args(sys.argv[1:]); loaded = load(settings, [])
kind, texts = prompt_texts(loaded.tokenizer, 4)
prompts = [p[0] for p in prompt_ids(loaded.tokenizer, texts, kind, 256, 96, "cpu")]
from selfspec.bench.methods import RandomDrafter
spec = SelfSpecModel(loaded.model, drafter=RandomDrafter(loaded.model.config.vocab_size), tokenizer=loaded.tokenizer)
spec.generate(prompts[0][-32:], max_new_tokens=32)
orig_obs, orig_ch = dl.AdaptiveDraftLength.observe, dl.AdaptiveDraftLength.choose
log = []
def ch(self):
    k = orig_ch(self)
    r = [self.expected_tokens(j) / self.step_cost(j) for j in range(5)]
    log.append([k, [round(x / r[0], 2) for x in r], round(self.overhead.per_step, 3), round(self.overhead.per_token, 3), [round(a, 2) for a in self.acceptance()[:3]], round(self.decline_rate(), 2)])
    return k
def obs(self, d, a, seconds=None, asked=None):
    dec = self.cost_curve.decode_seconds
    log[-1] += [d, a, None if seconds is None else round(seconds / dec, 2) if dec else None]
    return orig_obs(self, d, a, seconds, asked) if asked is not None else orig_obs(self, d, a, seconds)
dl.AdaptiveDraftLength.choose, dl.AdaptiveDraftLength.observe = ch, obs
print("curve", [round(spec.verify_cost()(k), 3) for k in range(6)])
out = spec.generate(prompts[1], max_new_tokens=128, eos_token_id=[])
for i, l in enumerate(log): print(i, l)
print("curve after", [round(spec.verify_cost()(k), 3) for k in range(6)])
