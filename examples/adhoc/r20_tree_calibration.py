"""Round 20 (Intel Xeon, one thread): is the EAGLE head's draft probability calibrated by depth? SmolLM2 with its EAGLE
head, greedy, held-out chat prompts, trees of N nodes at a fixed depth cap D (so every level is drafted), no node
floor (a given N has none; first run before the floor existed). For every verified node whose parent was accepted
(the node was "reached"), its conditional draft probability p (its score minus its parent's) and whether the
verifier accepted it; printed by depth and p bin: nodes reached, mean p, share accepted. Calibrated drafts accept at
about their p at every depth; a tree ranks nodes by the product of their p.
Usage: python examples/adhoc/r20_tree_calibration.py NUM_PROMPTS MAX_NEW_TOKENS N D"""
import sys
from collections import defaultdict

import torch
import transformers

import selfspec.verify_step as verify_step
from selfspec.drafters.tree_select import TreeCandidates, kept
from selfspec.engine import SelfSpecModel
from harness import smollm2_chat  # examples/adhoc/harness.py

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
num_prompts, max_new, tree_size, depth_cap = (int(a) for a in sys.argv[1:5])
model, tokenizer, prompts = smollm2_chat(num_prompts, max_new)
spec = SelfSpecModel(model, "eagle", heads="examples/smollm2/eagle", tokenizer=tokenizer, tree_size=tree_size)

kept_scores = []  # the last tree's kept nodes' cumulative log draft probabilities
best = TreeCandidates.best


def best_with_scores(self, budget, floor=-torch.inf):
    scores = torch.cat(self._scores)
    kept_scores[:] = scores[kept(scores, budget, floor)].tolist()
    return best(self, budget, floor)


TreeCandidates.best = best_with_scores
bins = defaultdict(lambda: [0, 0.0, 0])  # (depth, p bin) -> [reached, sum p, accepted]
verify_greedy = verify_step.verify_tree_greedy


def recorded(tree, target_logits):
    verdict = verify_greedy(tree, target_logits)
    parents, accepted = tree.parents.tolist(), set(verdict.accepted_nodes)
    depth = []
    for i, parent in enumerate(parents):
        depth.append(1 if parent < 0 else depth[parent] + 1)
        if parent < 0 or parent in accepted:
            p = float(torch.tensor(kept_scores[i] - (kept_scores[parent] if parent >= 0 else 0.0)).exp())
            key = (min(depth[i], 5), min(int(p * 10), 9))
            bins[key][0] += 1
            bins[key][1] += p
            bins[key][2] += i in accepted
    return verdict


verify_step.verify_tree_greedy = recorded
for prompt in prompts:
    spec.generate(prompt[0], max_new_tokens=max_new, do_sample=False, eos_token_id=[], num_draft_tokens=depth_cap)
print(f"{len(prompts)} prompts x {max_new} tokens, tree of {tree_size}, depth <= {depth_cap}")
print("depth  p bin     reached  mean p  accepted")
for depth in range(1, 6):
    rows = [(b, bins[(depth, b)]) for b in range(10) if (depth, b) in bins]
    total = [sum(r[i] for _, r in rows) for i in range(3)]
    for b, (n, p, a) in rows:
        print(f"{depth:5d}  {b / 10:.1f}-{(b + 1) / 10:.1f}  {n:7d}  {p / n:6.3f}  {a / n:6.3f}")
    if total[0]:
        print(f"{depth:5d}  all      {total[0]:7d}  {total[1] / total[0]:6.3f}  {total[2] / total[0]:6.3f}")
