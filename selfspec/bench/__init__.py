"""The side-by-side benchmark: every way to decode one model faster, on held-out prompts, in one process.

    python -m selfspec.bench --quick                                      # the reference model, a smoke run
    python -m selfspec.bench --model smollm2 --exit-layer 8 --t1          # SmolLM2-135M-Instruct (chat prompts)
    python -m selfspec.bench --model DIR --heads HEADS --eagle EAGLE --out results/ --time-limit 3600

Methods: plain `model.generate`; transformers' prompt lookup and early exit (and a two-model draft with
--draft-model); selfspec with speculation off and with every drafter at its default settings (plus a fixed
num_draft_tokens row each with --fixed-k). Modes: greedy and sampling at 0.7 with top-p 0.9 (--t1: also 1.0). Then
a num_draft_tokens sweep (greedy) and the useless-drafts check. Methods run in a fresh random order per round, prompt
and mode; medians over rounds; ratios against plain generate in the same round. Outputs (results.md, results.json,
sweep.png with matplotlib) go to --out, default examples/<model name>/bench/, after every phase.

Files: settings (flags), prompts (the shipped held-out prompts), models (loading), methods (the contestants),
schedule (interleaving, time limit), summary (medians, ratios), useless (the useless-drafts cases), report and plot
(output), machine, run (the phases).
"""
from __future__ import annotations


def main(argv=None) -> dict:
    """`python -m selfspec.bench` with these arguments; returns the report."""
    from selfspec.bench.run import main as run

    return run(argv)
