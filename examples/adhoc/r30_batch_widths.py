"""Round 30 (Intel Xeon with AMX, one thread): where batch "auto" loses to no drafts. The reference model's batch of B
code prompts (Medusa heads), MAX_NEW tokens stopping at EOS as the batch benchmark runs them, one wrapper for every
variant (as the benchmark's "selfspec batch" and "no drafts" rows share one): "auto" against fixed widths k = 0, 1, 2,
interleaved; per "auto" call its seconds and the width it chose at each step (a digit per step, "p" a probe), then the
median per-round ratio k0 / variant.
Usage: python examples/adhoc/r30_batch_widths.py ROUNDS [B] [MAX_NEW]"""
import statistics
import sys
import time

import torch
import transformers
from harness import interleaved, reference_batch

import selfspec.batch_draft_length as bdl

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
rounds = int(sys.argv[1])
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 16
max_new = int(sys.argv[3]) if len(sys.argv) > 3 else 96
spec, prompts = reference_batch(batch, max_new)
eos = spec.tokenizer.eos_token_id
widths = []
choose = bdl.BatchDraftLength.choose


def logged_choose(self, rows):
    width = choose(self, rows)
    widths.append("p" if self.probes.probing else str(width))
    return width


bdl.BatchDraftLength.choose = logged_choose
variants = {"auto": "auto", "k0": 0, "k1": 1, "k2": 2}
seconds, first = {name: [] for name in variants}, []


def run(name, _):
    widths.clear()
    started = time.perf_counter()
    out = spec.generate(prompts, max_new_tokens=max_new, num_draft_tokens=variants[name], eos_token_id=eos)
    seconds[name].append(time.perf_counter() - started)
    rows = [s.tolist() for s in out.sequences]
    first.append(rows)
    assert rows == first[0], f"{name}: rows differ"
    if name == "auto":
        print(f"auto {seconds[name][-1]:.2f}s tpf {out.stats.tokens_per_forward:.2f} {''.join(widths)}", flush=True)


spec.generate([p[-16:] for p in prompts[:2]], max_new_tokens=16)  # warm-up
for _ in interleaved(list(variants), [None], rounds, run):
    pass
for name in variants:
    ratio = statistics.median(x / y for x, y in zip(seconds["k0"], seconds[name]))
    print(f"{name}: median {statistics.median(seconds[name]):.2f}s, k0 / it per round {ratio:.3f}x")
print(f"reference batch {batch}, {max_new} tokens, {rounds} rounds: rows identical in every call")
