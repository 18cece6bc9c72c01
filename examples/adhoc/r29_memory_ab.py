"""Round 29 (Intel Xeon with AMX, one thread): what a wrapper's memory of "auto" across calls
(`draft_length.DraftLengthMemory`: at 654f23a every finished call's policy carried on, at 9f5cb7c and 781d4ff only a
drafter found useless; all three reverted in round 29, so this runs at 781d4ff or earlier, not at HEAD) does on
SmolLM2, paired: each case's wrapper as shipped
("remember") against the same wrapper built with a memory that keeps nothing ("afresh", every call from the prior, as
before round 29), on held-out chat prompts, 128 tokens, interleaved in a random order per prompt and round, each
variant warmed up by one 32-token call per mode (as the benchmark does). Cases: the shipped EAGLE head (trees of 10,
the default) greedy and sampled (T=0.7, top-p 0.9), the shipped Medusa heads greedy, and two useless drafters greedy
(random Medusa heads, early exit at the untrained layer 8). Round 8 tried carrying and reverted it: it cost the good
Medusa heads 3-5 % then (`r8_ab_mem.py`), before positions not drafted to aged back to their prior (round 20).
Prints each case's paired median ratio remember / afresh (time of afresh over time of remember: > 1 means carrying
is faster), tokens per forward and drafts per call of each.
Usage: python examples/adhoc/r29_memory_ab.py ROUNDS [NUM_PROMPTS [CASES]] (CASES: case names separated by "/", e.g.
"eagle tree, greedy/medusa, greedy"; default: every case)"""
import statistics
import sys
from pathlib import Path

import torch
import transformers

from selfspec.bench.methods import random_heads
from selfspec.draft_length import DraftLengthMemory
from selfspec.engine import SelfSpecModel
from harness import interleaved, smollm2_chat, timed_call  # examples/adhoc/harness.py

HEADS = Path(__file__).resolve().parents[1] / "smollm2"  # examples/smollm2
torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
model, tokenizer, prompts = smollm2_chat(int(sys.argv[2]) if len(sys.argv) > 2 else 3, 128)
noise = random_heads(model, seed=2)
GREEDY, SAMPLED = {"do_sample": False}, {"do_sample": True, "temperature": 0.7, "top_p": 0.9}
cases = {
    "eagle tree, greedy": (lambda: SelfSpecModel(model, heads=HEADS / "eagle"), GREEDY),
    "eagle tree, sampled": (lambda: SelfSpecModel(model, heads=HEADS / "eagle"), SAMPLED),
    "medusa, greedy": (lambda: SelfSpecModel(model, heads=HEADS / "heads"), GREEDY),
    "random medusa, greedy": (lambda: SelfSpecModel(model, "medusa", heads=noise), GREEDY),
    "early exit L=8, greedy": (lambda: SelfSpecModel(model, "early_exit", exit_layer=8), GREEDY),
}
chosen = sys.argv[3].split("/") if len(sys.argv) > 3 else None
for case, (build, mode) in cases.items():
    if chosen is not None and case not in chosen:
        continue
    specs = {"remember": build(), "afresh": build()}
    specs["afresh"]._draft_lengths = DraftLengthMemory(max_settings=0)  # keeps nothing: every call from the prior
    kwargs = dict(max_new_tokens=128, eos_token_id=[], **mode)

    def run(name, prompt):
        torch.manual_seed(int(prompt[0, -1]))  # the same draws for both variants of a pair (unseeded sampling)
        return timed_call(model, tokenizer, specs[name], prompt, **kwargs)

    for name in specs:
        timed_call(model, tokenizer, specs[name], prompts[0][:, -32:], **{**kwargs, "max_new_tokens": 32})
    results = list(interleaved(list(specs), prompts, rounds, run))
    ratios = [r["afresh"].seconds / r["remember"].seconds for r in results]
    same = sum(r["afresh"].new_tokens == r["remember"].new_tokens for r in results)
    print(f"{case:24s} remember/afresh {statistics.median(ratios):.3f}x ({min(ratios):.2f}-{max(ratios):.2f})  "
          + "  ".join(f"{name}: {statistics.mean(r[name].tokens_per_forward for r in results):.2f} tpf, "
                      f"{statistics.mean(r[name].stats.drafted for r in results):.1f} drafted"
                      for name in specs) + f"  same tokens {same}/{len(results)}", flush=True)
