"""Round 34 (the AMD EPYC): issue 11's tokens-per-forward target (>= 3.5, greedy, held-out chat prompts) against
trees larger and deeper than a CPU's "auto" drafts, as a GPU would verify them: SmolLM2 with the shipped EAGLE head,
each variant `N:D:K` a tree of N nodes (no probability floor), D levels deep every step (a fixed
num_draft_tokens, not "auto"), `tree_top_k` K (nodes expanded per level, children per expanded node); "auto" is the
default. One pass per variant over the same prompts (greedy: the tokens are the model's own, checked against
`generate`; tokens per forward do not depend on timing for a fixed depth), with seconds per call against `generate`'s
on this CPU for scale. Prints per variant: tokens per forward (total tokens / total target forwards), nodes verified
per step, acceptance by depth, speed relative to `generate`.
Usage: PYTHONPATH=examples/adhoc python examples/adhoc/r34_tree_ceiling.py THREADS NUM_PROMPTS MAX_NEW_TOKENS
VARIANT [VARIANT ...]"""
import sys

import torch
import transformers

from selfspec.engine import SelfSpecModel
from harness import smollm2_chat, timed_call  # examples/adhoc/harness.py

threads, num_prompts, max_new = (int(a) for a in sys.argv[1:4])
torch.set_num_threads(threads)
transformers.logging.set_verbosity_error()
model, tokenizer, prompts = smollm2_chat(num_prompts, max_new)
plain = [timed_call(model, tokenizer, None, p, max_new_tokens=max_new, do_sample=False, eos_token_id=[])
         for p in prompts]
print(f"{num_prompts} prompts x {max_new} tokens, {threads} thread(s); generate {sum(t.seconds for t in plain):.1f} s")
for variant in sys.argv[4:]:
    if variant == "auto":
        spec, depth = SelfSpecModel(model, heads="examples/smollm2/eagle", tokenizer=tokenizer), "auto"
    else:
        size, depth, top_k = (int(x) for x in variant.split(":"))
        spec = SelfSpecModel(model, heads="examples/smollm2/eagle", tokenizer=tokenizer, tree_size=size,
                             tree_top_k=top_k)
    timed_call(model, tokenizer, spec, prompts[0][:, -32:], max_new_tokens=16, do_sample=False, eos_token_id=[],
               num_draft_tokens=depth)  # warm-up
    runs = [timed_call(model, tokenizer, spec, p, max_new_tokens=max_new, do_sample=False, eos_token_id=[],
                       num_draft_tokens=depth) for p in prompts]
    same = sum(r.new_tokens == g.new_tokens for r, g in zip(runs, plain))
    tokens = sum(r.stats.new_tokens for r in runs)
    forwards = sum(r.stats.target_forwards for r in runs)
    drafted = sum(r.stats.drafted for r in runs)
    steps = forwards - len(runs)  # decode steps: every forward but the prefills
    reached = [sum(r.stats.accepted_by_position[i] if i < len(r.stats.accepted_by_position) else 0 for r in runs)
               for i in range(12)]
    by_depth = " ".join(f"{a / steps:.2f}" for a in reached if a)
    speed = sum(t.seconds for t in plain) / sum(r.seconds for r in runs)
    print(f"{variant:10s} tokens/forward {tokens / forwards:.2f}  nodes/step {drafted / steps:5.1f}  accepted at depth "
          f"1.. per step {by_depth}  {speed:.2f}x generate  {same}/{len(runs)} identical", flush=True)
