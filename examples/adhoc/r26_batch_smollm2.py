"""Round 26 (Intel Xeon with AMX, one thread): SmolLM2's batch of B (default 8) held-out chat prompts with its EAGLE
head, MAX_NEW tokens (default 64, stopping at EOS as the batch benchmark does): fixed k = 0, 1, 2 and "auto",
interleaved, ROUNDS rounds, one wrapper (its learned curve, overhead and rates kept across calls, as the engine keeps
them). Prints each call's seconds, the median of per-round ratios k0 / variant, then, from every timed step of each
variant (recorded around the batch loop's `_step`: its drafting, verify forward and verification; not the planner's
choice nor dropping finished rows), the steps per width, the median verify forward and the median rest of the step
in ms, shadow probes apart, and checks every variant's rows are identical.
Usage: python examples/adhoc/r26_batch_smollm2.py ROUNDS [B] [MAX_NEW]"""
import collections
import statistics
import sys
import time

import torch
import transformers
from harness import interleaved, smollm2_chat

import selfspec.batch as batch_loop
from selfspec.engine import SelfSpecModel

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()

batch = int(sys.argv[2]) if len(sys.argv) > 2 else 8
max_new = int(sys.argv[3]) if len(sys.argv) > 3 else 64
model, tokenizer, chats = smollm2_chat(batch, max_new)
prompts = [c[0] for c in chats]
spec = SelfSpecModel(model, heads="examples/smollm2/eagle", tokenizer=tokenizer)
steps = collections.defaultdict(list)  # (variant, width, shadow probe) -> [(verify ms, rest ms, rows, accepted)]
current = ["warm-up"]
step = batch_loop._step


def recorded(target, cache, rows, sampling, clock, planner, batch_drafter):
    started = time.perf_counter()
    drafts, verdicts, probes, emitted, verify_seconds = result = step(
        target, cache, rows, sampling, clock, planner, batch_drafter)
    step_ms = (time.perf_counter() - started) * 1e3
    key = (current[0], max(d.tokens.shape[0] for d in drafts), any(p is not None for p in probes))
    steps[key].append((verify_seconds * 1e3, step_ms - verify_seconds * 1e3, len(rows),
                       sum(v.num_accepted for v in verdicts)))
    return result


batch_loop._step = recorded
kw = dict(max_new_tokens=max_new)
spec.generate([p[-16:] for p in prompts[:2]], **kw)  # warm-up
variants = {"k0": 0, "k1": 1, "k2": 2, "auto": "auto"}
seconds = collections.defaultdict(list)
first_rows = []


def run(name, _):
    current[0] = name
    started = time.perf_counter()
    out = spec.generate(prompts, num_draft_tokens=variants[name], **kw)
    seconds[name].append(time.perf_counter() - started)
    rows = [s.tolist() for s in out.sequences]
    if not first_rows:
        first_rows.append(rows)
    assert rows == first_rows[0], f"{name}: rows differ"
    print(name, f"{seconds[name][-1]:.2f}s", flush=True)


for _ in interleaved(list(variants), [None], int(sys.argv[1]), run):
    pass
for name in variants:
    ratio = statistics.median(x / y for x, y in zip(seconds["k0"], seconds[name]))
    print(f"{name}: median {statistics.median(seconds[name]):.2f}s, k0 / it per round {ratio:.3f}x")
for (name, width, shadow), values in sorted(steps.items()):
    print(f"{name} w = {width}{' (shadow probe)' if shadow else ''}: {len(values)} steps, verify "
          f"{statistics.median(v[0] for v in values):.1f} ms, rest {statistics.median(v[1] for v in values):.1f} ms, "
          f"rows {statistics.mean(v[2] for v in values):.1f}, accepted per step "
          f"{statistics.mean(v[3] for v in values):.2f}")
print("rows identical in every call")
