"""Round 30 (Intel Xeon with AMX, one thread): the batch width chosen by the batch's remaining time ("new": the
batch ends with its slowest row, `BatchDraftLength.remaining_time`) against the objective it replaced ("old": the
expected tokens per second of a step over the rows in it) and no drafts ("k0"), in one process, interleaved, each
variant its own wrapper, every curve started from the kept one and saved nowhere (as r27_probe_rule_ab.py). MODEL:
reference (Medusa heads, code prompts, MAX_NEW default 96) or smollm2 (EAGLE head, chat prompts, MAX_NEW default 64);
both stop at EOS, as the batch benchmark runs them. Prints each variant's median seconds and the median per-round ratio
k0 / variant, and checks rows are identical.
Runs only at f3201c8-5195e34: the planner it measures (`BatchDraftLength.remaining_time`) was reverted.
Usage: python examples/adhoc/r30_makespan_ab.py MODEL ROUNDS [B] [MAX_NEW]   (from the repository root, with
PYTHONPATH=examples/adhoc)"""
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
    """Round 29's choose(): the width of the most expected tokens per unit of a step's cost."""

    def choose(self, rows):
        best, best_rate, self._num_rows = 0, 0.0, len(rows)
        widest = min(1, self.max_draft_tokens)
        while widest < self.max_draft_tokens and self._trusted(widest):
            widest += 1
        expected = [row[0].expected_tokens_up_to(widest) for row in rows]
        for w in range(widest + 1):
            ks = [max(0, min(w, row[1])) for row in rows]
            if w and max(ks) < w:
                break
            tokens = sum(row_expected[k] for row_expected, k in zip(expected, ks))
            rate = tokens / self.step_cost(len(rows), w, sum(ks))
            if rate > best_rate * (1.0 + self.min_gain if w and not best else 1.0):
                best, best_rate = w, rate
        best = self._measured_down(best, len(rows))
        if best:
            best = self._explore(best, max(row[1] for row in rows))
        return self.probes.after(best, may_probe=any(row[1] > 0 for row in rows))


def wrapper() -> SelfSpecModel:
    spec = SelfSpecModel(model, heads=heads, tokenizer=tokenizer)
    kept = spec.batch_verify_cost().path
    start = verify_cost._read_curve(kept) or verify_cost.straight(spec.verify_cost().snapshot())
    spec._batch_verify_cost = verify_cost.batch_cost_curve(start, None)
    return spec


specs = {"new": wrapper(), "old": wrapper(), "k0": wrapper()}
planners = {"new": BatchDraftLength, "old": OldPlanner, "k0": BatchDraftLength}
seconds, first_rows, tpf = {name: [] for name in specs}, [], {name: [] for name in specs}


def run(name, _):
    batch_loop.BatchDraftLength = planners[name]
    started = time.perf_counter()
    out = specs[name].generate(prompts, max_new_tokens=max_new, num_draft_tokens=0 if name == "k0" else "auto")
    seconds[name].append(time.perf_counter() - started)
    tpf[name].append(sum(len(s) for s in out.sequences) - sum(len(p) for p in prompts))
    rows = [s.tolist() for s in out.sequences]
    first_rows.append(rows)
    assert rows == first_rows[0], f"{name}: rows differ"


for name in specs:  # warm-up
    batch_loop.BatchDraftLength = planners[name]
    specs[name].generate([p[-16:] for p in prompts[:2]], max_new_tokens=16)
for _ in interleaved(list(specs), [None], rounds, run):
    print(" ".join(f"{name} {seconds[name][-1]:.2f}s" for name in specs), flush=True)
for name in specs:
    ratio = statistics.median(x / y for x, y in zip(seconds["k0"], seconds[name]))
    print(f"{name}: median {statistics.median(seconds[name]):.2f}s, k0 / it per round {ratio:.3f}x")
print(f"{which} batch {batch}, {max_new} tokens, {rounds} rounds: rows identical in every call")
