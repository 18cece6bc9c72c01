"""Round 21 (AMD EPYC with AVX-512, one thread): SmolLM2 with its EAGLE head, greedy, held-out chat prompts: plain
generate vs trees of N nodes above a floor of cumulative draft probability, with "auto" pricing a tree k levels deep
at the nodes such trees verified (new, this round) or at the most such a tree holds (budget, before), interleaved in
a random order per round, with the user's cache directory. Prints the median speedup over generate, tokens per
forward, nodes verified per step, and whether every run's tokens equal generate's.
Usage: python examples/adhoc/r21_node_pricing_ab.py ROUNDS NUM_PROMPTS MAX_NEW_TOKENS VARIANT [VARIANT ...]
where a VARIANT is new:N:FLOOR or budget:N:FLOOR (e.g. new:16:0.02)."""
import sys

import torch
import transformers

from selfspec.draft_length import AdaptiveDraftLength
from selfspec.engine import SelfSpecModel
from harness import greedy_against_generate, smollm2_chat  # examples/adhoc/harness.py

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
rounds, num_prompts, max_new = (int(a) for a in sys.argv[1:4])


class PricedAtBudget(AdaptiveDraftLength):
    """Round 20's pricing: the nodes a step verified are not learned."""

    def observe(self, *args, verified=None, **kwargs):
        super().observe(*args, **kwargs)


class BudgetSpec(SelfSpecModel):
    def _draft_length_policy(self, options, learn_step_cost=True):
        policy = super()._draft_length_policy(options, learn_step_cost)
        policy.__class__ = PricedAtBudget
        return policy


model, tokenizer, prompts = smollm2_chat(num_prompts, max_new)
specs = {}
for variant in sys.argv[4:]:
    pricing, size, floor = variant.split(":")
    kind = {"new": SelfSpecModel, "budget": BudgetSpec}[pricing]
    specs[variant] = kind(model, "eagle", heads="examples/smollm2/eagle", tokenizer=tokenizer, tree_size=int(size))
    specs[variant].min_node_probability = float(floor)
greedy_against_generate(model, tokenizer, specs, prompts, rounds, max_new)
