"""Round 35 (the AMD EPYC): EAGLE heads for SmolLM2 side by side on held-out chat prompts, by tokens per target
forward (greedy, a fixed depth per variant: deterministic, so one pass per head and variant needs no rounds), for the
head trained this round on more self-distillation data against the shipped one. Each variant `N:D:K` is a tree of N
nodes, D levels deep every step, `tree_top_k` K (as `r34_tree_ceiling.py`); `chain:D` a chain of D drafts; a variant
prefixed `s` (`s10:6:4`) samples at T=0.7, top-p 0.9 instead, with seeds 0..SEEDS-1 per prompt (SEEDS: the
environment variable, 3 unless set; sampled tokens are not compared with `generate`'s). DEPTHS (3 unless set): how
many depths' "reached" fractions to print in parentheses (the share of steps that accepted at least 1, 2, ... drafts).
A head written `DIR@full` is that head drafting over the model's whole vocabulary instead of its draft vocabulary
(the head predicts features; the draft vocabulary only picks which LM head rows project them).
The prompts are the benchmark's held-out chat questions FIRST..LAST-1 (the benchmark and the ceiling script measure
the first 3 and 6; choosing a head on 6..15 keeps those out of the choice). Every run is checked against `generate`.
Usage: PYTHONPATH=examples/adhoc python examples/adhoc/r35_head_ab.py FIRST LAST MAX_NEW_TOKENS HEAD_A,HEAD_B[,...]
VARIANT [VARIANT ...]"""
import os
import sys

import transformers

from selfspec.bench.models import load
from selfspec.bench.prompts import CHAT_PROMPTS, prompt_ids
from selfspec.bench.settings import parse_args
from heads import EagleHead
from selfspec.engine import SelfSpecModel
from harness import timed_call  # examples/adhoc/harness.py

first, last, max_new = (int(a) for a in sys.argv[1:4])
heads, variants = sys.argv[4].split(","), sys.argv[5:]
transformers.logging.set_verbosity_error()
loaded = load(parse_args(["--model", "smollm2", "--heads", "none", "--eagle", "none"]), [])
model, tokenizer = loaded.model, loaded.tokenizer
prompts = prompt_ids(tokenizer, list(CHAT_PROMPTS[first:last]), "chat", 2048, max_new, "cpu")
plain = [timed_call(model, tokenizer, None, p, max_new_tokens=max_new, do_sample=False, eos_token_id=[]).new_tokens
         for p in prompts]


def head_of(name: str):
    directory, _, vocab = name.partition("@")
    head = EagleHead.from_pretrained(directory, model=model)
    if vocab == "full":
        del head._buffers["draft_vocab"]
        head.draft_vocab = None
    return head


names = "ABCDEFGH"[:len(heads)]
mode = " and ".join(sorted({"sampled (T=0.7, top-p 0.9)" if v.startswith("s") else "greedy" for v in variants}))
print(f"prompts {first}..{last - 1} x {max_new} tokens, {mode}; heads " +
      " ".join(f"{name}={head}" for name, head in zip(names, heads)), flush=True)
seeds = range(int(os.environ.get("SEEDS", "3")))
for variant in variants:
    sampled, shape = variant.startswith("s"), variant.lstrip("s")
    line = []
    for name, directory in zip(names, heads):
        if shape.startswith("chain:"):
            spec = SelfSpecModel(model, heads=head_of(directory), tokenizer=tokenizer, tree_size=None)
            depth = int(shape[6:])
        else:
            size, depth, top_k = (int(x) for x in shape.split(":"))
            spec = SelfSpecModel(model, heads=head_of(directory), tokenizer=tokenizer, tree_size=size, tree_top_k=top_k)
        if sampled:
            runs = [timed_call(model, tokenizer, spec, p, max_new_tokens=max_new, do_sample=True, temperature=0.7,
                               top_p=0.9, seed=seed, eos_token_id=[], num_draft_tokens=depth)
                    for p in prompts for seed in seeds]
            checked = f"{len(runs)} sampled runs"
        else:
            runs = [timed_call(model, tokenizer, spec, p, max_new_tokens=max_new, do_sample=False, eos_token_id=[],
                               num_draft_tokens=depth) for p in prompts]
            checked = f"{sum(r.new_tokens == g for r, g in zip(runs, plain))}/{len(runs)} identical"
        tokens = sum(r.stats.new_tokens for r in runs)
        forwards = sum(r.stats.target_forwards for r in runs)
        steps = forwards - len(runs)
        reached = [sum(r.stats.accepted_by_position[i] if i < len(r.stats.accepted_by_position) else 0 for r in runs)
                   for i in range(int(os.environ.get("DEPTHS", "3")))]
        by_depth = " ".join(f"{a / steps:.2f}" for a in reached)
        line.append(f"{name} {tokens / forwards:.3f} ({by_depth}; {checked})")
    print(f"{variant:9s} tokens/forward  " + "   ".join(line), flush=True)
