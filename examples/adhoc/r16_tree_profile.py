"""Round 16 (AMD EPYC, one thread): where a tree step's time goes, and a paired A/B of round 16's two changes to tree
drafting: the draft vocabulary's LM head rows routed through the few-row kernel (round 15: F.linear over a tree
level's rows) and nodes that could not be kept left unexpanded (round 15: every frontier node expanded, every level).
SmolLM2 with its EAGLE head, held-out chat prompts, greedy, tree_size=N, "auto" draft length.
Part 1, interleaved in a random order per round: generate vs the tree as in round 16 vs as in round 15 (both
changes undone); median speedup over generate, tokens per forward, identical tokens.
Part 2, one pass per prompt (round 16) with timers around the drafter's parts: per step, in decodes (generate's
seconds per token), drafting (head forwards, draft-vocabulary projections) and verification (full logits), and the
mean depth and nodes.
Part 3, the same pass, by rank of a kept node (its cumulative draft probability, most probable first): the mean draft
probability against how often the verifier accepted it (calibration: what nodes beyond the budget would be worth),
and the cumulative draft probabilities of ranks up to 24.
Usage: python examples/adhoc/r16_tree_profile.py ROUNDS NUM_PROMPTS MAX_NEW_TOKENS N"""
import random
import statistics
import sys
import time
from collections import defaultdict

import torch
import transformers

from selfspec.bench.models import load
from selfspec.bench.prompts import prompt_ids, prompt_texts
from selfspec.bench.settings import parse_args
import selfspec.drafters.eagle as eagle
from selfspec.drafters import tree_select
from selfspec.engine import SelfSpecModel
from selfspec.few_row_linear import FewRowLinears

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
rounds, num_prompts, max_new, tree_size = (int(a) for a in sys.argv[1:5])
loaded = load(parse_args(["--model", "smollm2", "--heads", "none", "--eagle", "examples/smollm2/eagle"]), [])
model, tokenizer = loaded.model, loaded.tokenizer
kind, texts = prompt_texts(tokenizer, num_prompts)
prompts = prompt_ids(tokenizer, texts, kind, 2048, max_new, "cpu")
heads = "examples/smollm2/eagle"
routed = SelfSpecModel(model, "eagle", heads=heads, tokenizer=tokenizer, tree_size=tree_size)
round15 = SelfSpecModel(model, "eagle", heads=heads, tokenizer=tokenizer, tree_size=tree_size)
round15.few_row_linears = FewRowLinears(model, round15.heads)  # round 15: the heads' layers only
specs = {"tree, round 16": routed, "tree, as round 15": round15}
floored = eagle.frontier
kw = dict(max_new_tokens=max_new, eos_token_id=[], do_sample=False)


def run(name, prompt):
    started = time.perf_counter()
    if name == "generate":
        out = model.generate(prompt, pad_token_id=tokenizer.eos_token_id, attention_mask=torch.ones_like(prompt), **kw)
        return time.perf_counter() - started, 1.0, out[0, prompt.shape[1]:].tolist()
    if name == "tree, as round 15":  # every frontier node expanded
        eagle.frontier = lambda ids, scores, width, floor: floored(ids, scores, width)
    try:
        out = specs[name].generate(prompt[0], **kw)
    finally:
        eagle.frontier = floored
    return time.perf_counter() - started, out.stats.tokens_per_forward, out.sequences[0, prompt.shape[1]:].tolist()


for spec in specs.values():
    spec.generate(prompts[0][0][-32:], max_new_tokens=32, eos_token_id=[])  # warm-up
variants = ["generate", *specs]
ratios, per_forward, same = defaultdict(list), defaultdict(list), defaultdict(int)
decode_seconds = []
rng = random.Random(0)
for _ in range(rounds):
    for prompt in prompts:
        order = list(variants)
        rng.shuffle(order)
        results = {name: run(name, prompt) for name in order}
        decode_seconds.append(results["generate"][0] / max_new)
        for name, (seconds, tpf, tokens) in results.items():
            ratios[name].append(results["generate"][0] / seconds)
            per_forward[name].append(tpf)
            same[name] += tokens == results["generate"][2]
print(f"Part 1: {rounds} rounds x {len(prompts)} prompts, {max_new} tokens, tree_size={tree_size}, greedy")
for name in variants:
    r = ratios[name]
    print(f"  {name:22s} {statistics.median(r):.3f}x of generate ({min(r):.2f}-{max(r):.2f}), "
          f"{statistics.median(per_forward[name]):.2f} tokens per forward, identical {same[name]}/{len(r)}")

# Part 2: timers around the parts of one tree step.
decode = statistics.median(decode_seconds)
spent = defaultdict(float)
drafter = routed.drafter


def timed(label, function):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - started
    return wrapper


shapes = defaultdict(int)
propose, verify = drafter.propose, routed._verify_step
head_forward, logits = drafter.head.forward, routed.target.logits


def recording_propose(context):
    draft = propose(context)
    shapes["steps"] += 1
    shapes["nodes"] += draft.num_draft_tokens
    shapes["depth"] += draft.depth
    return draft


RANKS = 24
value_by_rank, accepted_by_rank = torch.zeros(RANKS), torch.zeros(RANKS)
best = tree_select.TreeCandidates.best


def recording_best(self, budget, floor=-torch.inf):  # (round 20: best takes the node floor)
    scores = torch.cat(self._scores).sort(descending=True).values[:RANKS].exp()  # [<= RANKS] what ranks would hold
    value_by_rank[: scores.shape[0]] += scores
    return best(self, budget, floor)


def recording_verify(*args):
    verdict, accepted, kept_hidden, probe = verify(*args)
    if probe is None:
        for node in getattr(verdict, "accepted_nodes", ()):
            accepted_by_rank[node] += 1
    return verdict, accepted, kept_hidden, probe


tree_select.TreeCandidates.best = recording_best
drafter.propose = timed("propose", recording_propose)
routed._verify_step = timed("verify", recording_verify)
drafter.head.forward = timed("head forwards", head_forward)
routed.target.logits = lambda hidden, vocab_ids=None: timed(
    "draft-vocabulary projections" if vocab_ids is not None else "full logits", logits)(hidden, vocab_ids)
tokens = 0
started = time.perf_counter()
for prompt in prompts:
    routed.generate(prompt[0], **kw)
    tokens += max_new
total = time.perf_counter() - started
steps = shapes["steps"]
print(f"Part 2: one pass, {steps} drafted steps, {tokens} tokens; per drafted step, in decodes "
      f"({decode * 1e3:.1f} ms):")
print(f"  mean depth {shapes['depth'] / steps:.2f}, nodes {shapes['nodes'] / steps:.2f}")
for label in ("propose", "head forwards", "draft-vocabulary projections", "verify", "full logits"):
    print(f"  {label:30s} {spent[label] / steps / decode:.3f}")
print(f"  whole call per token: {total / tokens / decode:.3f} decodes (speedup {decode * tokens / total:.2f}x)")
print(f"Part 3, by rank (1 = most probable kept node; ranks > {tree_size} were not verified): mean cumulative draft "
      "probability / share of steps the verifier accepted that node")
for rank in range(RANKS):
    accepted = f"{accepted_by_rank[rank] / steps:.3f}" if rank < tree_size else "-"
    print(f"  rank {rank + 1:2d}: {value_by_rank[rank] / steps:.3f} / {accepted}")
print(f"  sum over the kept nodes: {value_by_rank[:tree_size].sum() / steps:.2f} predicted, "
      f"{accepted_by_rank.sum() / steps:.2f} accepted per step")
