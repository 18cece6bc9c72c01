"""Choose the draft-length defaults from a real model's drafts: replay fixed k, "auto" with given settings and
confidence thresholds over the same greedy continuations, without re-running the model once per policy.

    OMP_NUM_THREADS=1 python examples/draft_length_replay.py --model /work/runs/reference-model --prompts 12

While greedy drafts are right they only depend on the true sequence, so one forward over prompt + continuation
tells, for every position t, how many consecutive drafts from t would be accepted: early exit at layer L drafts the
exit's argmax at t, t+1, ...; n-gram looks up seq[:t+1]; Medusa heads read the hidden state at t-1. A policy is replayed by asking for k at t, accepting
min(k, proposed, right[t]) and moving on by that + 1. Step costs, in one-token decodes, come from forwards timed
here (CPU time, fastest of several rounds): verify V(k) = forward over k + 1 tokens; early exit with shared work costs
(d + 1) exit passes (first L layers + norm + LM head, one token each) + the remaining layers over d + 1 tokens.
Prints tokens per unit cost (= speedup over plain decoding under this cost model) for every policy.
"""
from __future__ import annotations

import argparse
import itertools
import json
import time

import torch

from heads import MedusaHeads
from selfspec.draft_length.policy import AdaptiveDraftLength, VerifyCost, _non_decreasing
from selfspec.drafters.ngram import lookup
from selfspec.target import TargetModel

MAX_K = 8
DEFAULT_NAME = "auto decay=0.9 prior=0.5x4.0 probe=8"  # AdaptiveDraftLength's defaults, as named below


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--exit-layer", type=int, default=2)
    parser.add_argument("--heads", help="Medusa heads directory: replay them too")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--prompt-chars", type=int, default=400)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--overhead", type=float, default=0.1, help="engine bookkeeping per step, in decodes")
    parser.add_argument("--rounds", type=int, default=15, help="timing rounds (fastest kept)")
    parser.add_argument("--json", help="write every policy's speedup here")
    parser.add_argument("--show", type=int, default=12, help="best policies shown per drafter (and every fixed k)")
    return parser.parse_args(argv)


@torch.inference_mode()
def measure_costs(target: TargetModel, exit_layer: int, rounds: int, heads=None, context: int = 128) -> dict:
    """One-token decode, verify V(k), exit pass, remaining-layers verify and one Medusa head, in one-token decodes.

    CPU time of this process (this tool wants the intrinsic cost ratios; the machine is shared, and wall time would
    mostly measure the other jobs), all items interleaved in every round, fastest of `rounds` kept.
    """
    cache = target.new_cache()
    ids = torch.arange(context + MAX_K + 1) % target.vocab_size
    target.forward(ids[:context], cache)
    new = lambda n: ids[context : context + n]  # noqa: E731
    items = {"decode": lambda: target.logits(target.forward(new(1), cache)),
             "exit": lambda: target.logits(target.final_norm(target.exit_forward(new(1), cache, exit_layer)))}
    for k in range(MAX_K + 1):
        items[f"verify{k}"] = lambda k=k: target.logits(target.forward(new(k + 1), cache))
        items[f"rest{k}"] = lambda k=k: target.logits(target.forward(new(k + 1), cache, exit_layer, prefilled[k]))
    if heads is not None:
        hidden = torch.zeros(target.hidden_size)
        items["head"] = lambda: heads(hidden, target.logits, heads.num_heads)
    prefilled = {}
    best = dict.fromkeys(items, float("inf"))
    for round_ in range(rounds + 1):  # round 0 warms up
        for name, fn in items.items():
            if name.startswith("rest"):  # the first layers ran while drafting: untimed here
                k = int(name[4:])
                prefilled[k] = target.exit_forward(new(k + 1), cache, exit_layer)
            started = time.process_time()
            fn()
            if round_:
                best[name] = min(best[name], time.process_time() - started)
            cache.rollback(context)
    decode = best["decode"]
    verify = VerifyCost(tuple(_non_decreasing([max(1.0, best[f"verify{k}"] / decode) for k in range(MAX_K + 1)])), decode)
    rest = VerifyCost(tuple(_non_decreasing([best[f"rest{k}"] / decode for k in range(MAX_K + 1)])), decode)
    head = best["head"] / decode / heads.num_heads if heads is not None else 0.0
    return {"verify": verify, "exit": best["exit"] / decode, "rest": rest, "plain": 1.0, "head": head}


@torch.inference_mode()
def traces(model, tokenizer, target, args, heads=None):
    """Per prompt: (prompt length, seq, exit_right [T], exit_confidence [T], medusa) for the greedy continuation;
    medusa: (right [T, heads], confidence [T, heads]) of the heads reading position t's hidden state, or None."""
    from training.corpus import heldout_prompts

    out = []
    for text in heldout_prompts(args.prompts, args.prompt_chars, seed=0):
        prompt = tokenizer(text, return_tensors="pt").input_ids
        seq = model.generate(prompt, max_new_tokens=args.max_new_tokens, do_sample=False,
                             attention_mask=torch.ones_like(prompt), eos_token_id=None, pad_token_id=0)[0]
        hidden = target.exit_forward(seq, target.new_cache(), args.exit_layer)  # [T, hidden]
        probs = target.logits(target.final_norm(hidden)).float().softmax(-1)  # [T, vocab]
        right = torch.cat([probs[:-1].argmax(-1) == seq[1:], torch.tensor([False])])
        medusa = None
        if heads is not None:  # head i at hidden t guesses seq[t + 2 + i]
            head_probs = heads(target.forward(seq, target.new_cache()), target.logits).float().softmax(-1)  # [T, H, V]
            num_heads, length = head_probs.shape[1], seq.shape[0]
            future = torch.stack([torch.cat([seq[2 + i :], seq.new_full((2 + i,), -1)]) for i in range(num_heads)], 1)
            medusa = ((head_probs.argmax(-1) == future[:length]).tolist(), head_probs.max(-1).values.tolist())
        out.append((prompt.shape[1], seq, right.tolist(), probs.max(-1).values.tolist(), medusa))
    return out


def run_length(flags, t, cap):
    n = 0
    while n < cap and t + n < len(flags) and flags[t + n]:
        n += 1
    return n


def replay(trace, drafter, choose_k, observe, min_confidence, costs):
    """Tokens and cost of one generation under a policy (choose_k() -> k; observe(d, a, step_cost))."""
    prompt_len, seq, right, confidence, medusa = trace
    t, end, tokens, cost = prompt_len, len(seq) - 1, 0, 0.0  # seq[t]: the pending token (prefill chose it)
    while t < end:
        k = min(choose_k(), end - t - 1)
        if drafter == "early_exit":
            proposed = run_length([c >= min_confidence for c in confidence], t, k) if min_confidence else k
            accepted = min(run_length(right, t, MAX_K), proposed)
            step = costs["plain"] if proposed == 0 and k == 0 else (proposed + 1) * costs["exit"] + costs["rest"](proposed)
        elif drafter == "medusa":  # the pending token seq[t] was predicted from hidden t - 1: its heads draft
            head_right, head_confidence = medusa[0][t - 1], medusa[1][t - 1]
            k = min(k, len(head_right))
            proposed = run_length([c >= min_confidence for c in head_confidence], 0, k) if min_confidence else k
            accepted = run_length(head_right, 0, proposed)
            step = costs["verify"](proposed) + proposed * costs["head"]
        else:
            draft = lookup(seq[: t + 1], k, 3, 1)
            proposed = draft.shape[0]
            accepted = run_length((draft == seq[t + 1 : t + 1 + proposed]).tolist(), 0, proposed)
            step = costs["verify"](proposed)
        step += costs["overhead"]
        observe(proposed, accepted, step)
        tokens, cost, t = tokens + accepted + 1, cost + step, t + accepted + 1
    return tokens, cost


def evaluate(all_traces, drafter, make_policy, min_confidence, costs):
    tokens = cost = 0.0
    for trace in all_traces:
        choose, observe = make_policy()
        n, c = replay(trace, drafter, choose, observe, min_confidence, costs)
        tokens, cost = tokens + n, cost + c
    return tokens / cost * (1 + costs["overhead"])  # speedup over plain decoding (1 token per 1 + overhead)


def fixed(k):
    return lambda: (lambda: k, lambda d, a, s: None)


def auto(verify, **settings):
    def make():
        policy = AdaptiveDraftLength(verify, learn_step_cost=False, **settings)

        def observe(d, a, step):
            policy.observe(d, a)
            policy.observe_overhead(d, step - verify(d))
        return policy.choose, observe
    return make


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    target = TargetModel(model)
    heads = MedusaHeads.from_pretrained(args.heads, model=model).eval() if args.heads else None
    costs = {**measure_costs(target, args.exit_layer, args.rounds, heads), "overhead": args.overhead}
    verify = costs["verify"]
    print(f"verify V(k): {[round(v, 2) for v in verify.relative]}; early exit at {args.exit_layer}: exit pass "
          f"{costs['exit']:.2f}, remaining layers {[round(v, 2) for v in costs['rest'].relative]}; Medusa head "
          f"{costs['head']:.2f} (one-token decodes; decode {1000 * verify.decode_seconds:.1f} ms CPU)")
    started = time.perf_counter()
    all_traces = traces(model, tokenizer, target, args, heads)
    exit_right = sum(sum(t[2][t[0] - 1 :]) for t in all_traces) / sum(len(t[1]) - t[0] for t in all_traces)
    print(f"{len(all_traces)} prompts x {args.max_new_tokens} tokens traced in {time.perf_counter() - started:.0f}s; "
          f"exit layer {args.exit_layer} top-1 agreement {exit_right:.2f}")

    results = {"costs": {"verify": verify.relative, "exit": costs["exit"], "rest": costs["rest"].relative,
                         "head": costs["head"]}}
    for drafter in ("ngram", "early_exit") + (("medusa",) if heads is not None else ()):
        print(f"\n== {drafter}")
        rows = [(f"fixed k={k}", evaluate(all_traces, drafter, fixed(k), 0.0, costs)) for k in range(MAX_K + 1)]
        if drafter != "ngram":
            for k, c in itertools.product((1, 2, 3, 4, 6, 8), (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)):
                rows.append((f"fixed k={k} conf>={c}", evaluate(all_traces, drafter, fixed(k), c, costs)))
        grid = itertools.product((0.8, 0.9, 0.95), (0.3, 0.5, 0.7), (1.0, 4.0, 8.0, 16.0), (8, 16, 32))
        grid = [g for g in grid if g[3] == 8 or g[:3] == (0.9, 0.5, 4.0)]  # probe_every only matters at k=0
        for decay, prior, weight, probe in grid:
            make = auto(verify, decay=decay, prior_acceptance=prior, prior_weight=weight, probe_every=probe)
            name = f"auto decay={decay} prior={prior}x{weight} probe={probe}"
            rows.append((name, evaluate(all_traces, drafter, make, 0.0, costs)))
            if drafter != "ngram":
                for c in (0.1, 0.2, 0.3, 0.5):
                    rows.append((name + f" conf>={c}", evaluate(all_traces, drafter, make, c, costs)))
        rows.sort(key=lambda r: -r[1])
        results[drafter] = dict(rows)
        best_fixed = max(r[1] for r in rows if r[0].startswith("fixed") and "conf" not in r[0])
        for rank, (name, speedup) in enumerate(rows):
            if rank < args.show or name.startswith("fixed") or name.startswith(DEFAULT_NAME):
                print(f"  {speedup:.3f}x  {name}")
        defaults = [r for r in rows if r[0] == DEFAULT_NAME][0]
        print(f"  ... best fixed k (no threshold): {best_fixed:.3f}x; current auto defaults: {defaults[1]:.3f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
