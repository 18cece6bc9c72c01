"""The side-by-side benchmark: every way to decode one model faster, on held-out prompts, in one process.

    python -m selfspec.bench --model smollm2              # SmolLM2-135M-Instruct: the README's table (~20 min, 2 cores)
    python -m selfspec.bench --model smollm2 --quick      # the same rows on a short run (a few minutes)
    python -m selfspec.bench --quick                      # the project's reference model (ships in the repository)
    python -m selfspec.bench --model smollm2 --llama-cpp  # plus a llama.cpp row on the same GGUF file

Rows: plain `model.generate` (the baseline), selfspec with speculation off and with every drafter at its defaults
(ngram, early exit, and the shipped heads: Medusa, EAGLE at its default and as a chain where that default is a
tree, EAGLE-3 when shipped); flags add
transformers' assisted generation, llama.cpp, fixed num_draft_tokens and tree/chain/kernel variants. Modes: greedy,
sampling at 0.7 with top-p 0.9 without a seed, and the same with selfspec's seed= (tokens compared with speculation
off's under the same seed). Methods run in a fresh random order per round, prompt and mode; medians over rounds;
ratios against generate and speculation off in the same round. Optional phases: a num_draft_tokens sweep
(--sweep-max) and the useless-drafts check (--useless-prompts). Outputs (results.md, results.json, and with
matplotlib speedup.png and sweep.png) go to --out, default bench-results/<model name>/ in the working directory,
after every phase; the table is printed at the end with the command that made it.

Files: settings (flags), prompts (the shipped held-out prompts), models (loading), methods (the contestants),
llama_cpp (the optional llama.cpp contestant), schedule (interleaving, time limit), summary (medians, ratios,
identity), useless (the useless-drafts cases), report and plot (output), machine, run (the phases).
"""
from __future__ import annotations


def main(argv=None) -> dict:
    """`python -m selfspec.bench` with these arguments; returns the report."""
    from selfspec.bench.run import main as run

    return run(argv)
