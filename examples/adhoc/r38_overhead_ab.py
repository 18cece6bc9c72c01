"""Round 38 (AMD EPYC with AVX-512, one thread): what learning plain and drafting steps' overhead apart
(`AdaptiveDraftLength.step_overhead`, round 38) does on SmolLM2, paired: each case's wrapper as shipped ("split")
against the same wrapper whose policies fit one line through every step, as before round 38 ("one line": a drafting
step's fixed cost shared with k = 0, no ageing), on held-out chat prompts, 128 tokens, interleaved in a random
order per prompt and round, each variant warmed up by one 32-token call. Cases: the shipped EAGLE head (trees of 10,
the default) greedy and sampled (T=0.7, top-p 0.9), the shipped Medusa heads greedy and sampled, and two useless
drafters greedy (random Medusa heads, early exit at the untrained layer 8).
Prints each case's paired median ratio split / one line (time of one line over time of split: > 1 means the split is
faster), tokens per forward and drafts per call of each.
Usage: python examples/adhoc/r38_overhead_ab.py ROUNDS [NUM_PROMPTS [CASES]] (CASES: case names separated by "/")"""
import statistics
import sys
from pathlib import Path

import torch
import transformers

from selfspec.bench.methods import random_heads
from selfspec.draft_length import AdaptiveDraftLength, StepOverhead
from selfspec.engine import SelfSpecModel
from harness import interleaved, smollm2_chat, timed_call  # examples/adhoc/harness.py

HEADS = Path(__file__).resolve().parents[1] / "smollm2"  # examples/smollm2
torch.set_num_threads(1)
transformers.logging.set_verbosity_error()


class _NeverAges(StepOverhead):
    def age(self, factor: float) -> None:
        pass


class _IntoTheLine:
    """A plain step's overhead as the one line saw it: nothing of its own, its steps fed to the line."""

    def __init__(self, line: StepOverhead):
        self.line = line

    def predict(self, num_drafted: int) -> float:
        return 0.0

    def observe(self, num_drafted: int, residual: float) -> None:
        self.line.observe(num_drafted, residual)


class OneLine(SelfSpecModel):
    """Every "auto" policy fits one line through plain and drafting steps, as before round 38."""

    def _draft_length_policy(self, options, learn_step_cost: bool = True):
        policy = super()._draft_length_policy(options, learn_step_cost)
        if isinstance(policy, AdaptiveDraftLength):
            policy.overhead = _NeverAges(policy.decay, per_token=policy.overhead.prior_per_token)
            policy.plain_overhead = _IntoTheLine(policy.overhead)
            policy.step_overhead = policy.overhead.predict  # k = 0 priced by the line's intercept too
        return policy


rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
model, tokenizer, prompts = smollm2_chat(int(sys.argv[2]) if len(sys.argv) > 2 else 3, 128)
noise = random_heads(model, seed=2)
GREEDY, SAMPLED = {"do_sample": False}, {"do_sample": True, "temperature": 0.7, "top_p": 0.9}
cases = {
    "eagle tree, greedy": (lambda kind: kind(model, heads=HEADS / "eagle"), GREEDY),
    "eagle tree, sampled": (lambda kind: kind(model, heads=HEADS / "eagle"), SAMPLED),
    "medusa, greedy": (lambda kind: kind(model, heads=HEADS / "heads"), GREEDY),
    "medusa, sampled": (lambda kind: kind(model, heads=HEADS / "heads"), SAMPLED),
    "random medusa, greedy": (lambda kind: kind(model, "medusa", heads=noise), GREEDY),
    "early exit L=8, greedy": (lambda kind: kind(model, "early_exit", exit_layer=8), GREEDY),
}
chosen = sys.argv[3].split("/") if len(sys.argv) > 3 else None
for case, (build, mode) in cases.items():
    if chosen is not None and case not in chosen:
        continue
    specs = {"split": build(SelfSpecModel), "one line": build(OneLine)}
    kwargs = dict(max_new_tokens=128, eos_token_id=[], **mode)

    def run(name, prompt):
        torch.manual_seed(int(prompt[0, -1]))  # the same draws for both variants of a pair (unseeded sampling)
        return timed_call(model, tokenizer, specs[name], prompt, **kwargs)

    for name in specs:
        timed_call(model, tokenizer, specs[name], prompts[0][:, -32:], **{**kwargs, "max_new_tokens": 32})
    results = list(interleaved(list(specs), prompts, rounds, run))
    ratios = [r["one line"].seconds / r["split"].seconds for r in results]
    same = sum(r["one line"].new_tokens == r["split"].new_tokens for r in results)
    print(f"{case:24s} split/one line {statistics.median(ratios):.3f}x ({min(ratios):.2f}-{max(ratios):.2f})  "
          + "  ".join(f"{name}: {statistics.mean(r[name].tokens_per_forward for r in results):.2f} tpf, "
                      f"{statistics.mean(r[name].stats.drafted for r in results):.1f} drafted"
                      for name in specs) + f"  same tokens {same}/{len(results)}", flush=True)
