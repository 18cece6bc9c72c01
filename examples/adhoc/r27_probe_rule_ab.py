"""Round 27 (Intel Xeon with AMX, one thread): ab3c16e's batch planning against the rules it replaced, in one process,
interleaved: "new" (a kept batch price holds until timed here; a probe is verified for real until as many rows at
width 1 were timed recently; rates overrule only when faster by more than min_gain), "old" (the kept curve whole as
the start; a probe in shadow once its total was timed anywhere; rates overrule on any difference) and "k0" (no drafts),
each variant its own wrapper, every curve started from the kept one and saved nowhere. MODEL: reference (Medusa heads,
code prompts, MAX_NEW default 96) or smollm2 (EAGLE head, chat prompts, MAX_NEW default 64); both stop at EOS.
Prints each variant's median seconds and the median per-round ratio k0 / variant, and checks rows are identical.
Usage: python examples/adhoc/r27_probe_rule_ab.py MODEL ROUNDS [B] [MAX_NEW]"""
import statistics
import sys
import time

import torch
import transformers
from harness import interleaved, reference_batch, smollm2_chat

import selfspec.batch as batch_loop
import selfspec.verify_cost as verify_cost
from selfspec.batch_draft_length import BatchDraftLength
from selfspec.engine import SelfSpecModel

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
which, rounds = sys.argv[1], int(sys.argv[2])
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 8
max_new = int(sys.argv[4]) if len(sys.argv) > 4 else (96 if which == "reference" else 64)
if which == "reference":
    spec, prompts = reference_batch(batch, max_new)
    model, tokenizer, heads = spec.model, spec.tokenizer, "examples/reference/heads"
else:
    model, tokenizer, chats = smollm2_chat(batch, max_new)
    prompts, heads = [c[0] for c in chats], "examples/smollm2/eagle"


class OldPlanner(BatchDraftLength):
    def probe_in_shadow(self, full_forward: bool = True) -> bool:
        return self.probes.probing and self._trusted(1)

    def _measured_down(self, width: int, num_rows: int) -> int:
        rates = [(rate, w) for w in range(width + 1) if (rate := self.measured_rate(num_rows, w)) is not None]
        if not rates:
            return width
        fastest = max(rates)
        return width if fastest is rates[-1] else fastest[1]


def wrapper(old: bool) -> SelfSpecModel:
    spec = SelfSpecModel(model, heads=heads, tokenizer=tokenizer)
    kept_path = spec.batch_verify_cost().path
    start = verify_cost._read_curve(kept_path) or verify_cost.straight(spec.verify_cost().snapshot())
    spec._batch_verify_cost = (verify_cost.LearnedVerifyCost(start, None, prior_weight=0.01,
                                                             size=verify_cost.BATCH_CURVE_SIZE, non_decreasing=False)
                               if old else verify_cost.batch_cost_curve(start, None))
    return spec


specs = {"new": wrapper(False), "old": wrapper(True), "k0": wrapper(False)}
planners = {"new": BatchDraftLength, "old": OldPlanner, "k0": BatchDraftLength}
seconds, first_rows = {name: [] for name in specs}, []


def run(name, _):
    batch_loop.BatchDraftLength = planners[name]
    started = time.perf_counter()
    out = specs[name].generate(prompts, max_new_tokens=max_new, num_draft_tokens=0 if name == "k0" else "auto")
    seconds[name].append(time.perf_counter() - started)
    rows = [s.tolist() for s in out.sequences]
    first_rows.append(rows)
    assert rows == first_rows[0], f"{name}: rows differ"


for name in specs:  # warm-up
    batch_loop.BatchDraftLength = planners[name]
    specs[name].generate([p[-16:] for p in prompts[:2]], max_new_tokens=16)
for _ in interleaved(list(specs), [None], rounds, run):
    pass
for name in specs:
    ratio = statistics.median(x / y for x, y in zip(seconds["k0"], seconds[name]))
    print(f"{name}: median {statistics.median(seconds[name]):.2f}s, k0 / it per round {ratio:.3f}x")
print(f"{which} batch {batch}, {max_new} tokens, {rounds} rounds: rows identical in every call")
