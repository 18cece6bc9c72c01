"""selfspec in one minute: the shipped reference model completes a piece of Python it never saw in training, once
with plain `model.generate` and once drafting for itself with its Medusa heads. Greedy, so both write exactly the
same tokens; selfspec just needs fewer passes through the model.

    python examples/demo.py                 # one CPU thread, well under two minutes
    python examples/demo.py --max-new-tokens 200 --runs 7 --num-draft-tokens 2

The full comparison (transformers' prompt lookup, early exit, a separate draft model; sampling; a sweep of the
number of draft tokens) is `python -m selfspec.bench`.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REFERENCE = Path(__file__).resolve().parent / "reference"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(REFERENCE / "model"), help="model directory (default: the reference model)")
    parser.add_argument("--heads", default=str(REFERENCE / "heads"), help="Medusa heads directory for that model")
    parser.add_argument("--max-new-tokens", type=int, default=128,
                        help="128: the prompt plus the completion stay within the 256 positions the model trained on")
    parser.add_argument("--num-draft-tokens", default="auto",
                        help='drafts per step, or "auto" (default): chosen each step from the acceptance so far and this '
                             "device's measured cost of verifying k drafts (on a CPU that cost grows with k; on a GPU "
                             "it hardly does)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs of each, interleaved; the median is shown")
    parser.add_argument("--prompt-seed", type=int, default=0, help="which held-out prompt (training.corpus.heldout_prompts)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads; 1 gives stable timings for a small model")
    return parser.parse_args(argv)


def load(args):
    """(model, tokenizer, SelfSpecModel, what drafts); exits with the command to run when the model is missing."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from selfspec import SelfSpecModel

    if not (Path(args.model) / "config.json").is_file():
        sys.exit(f"demo: no model at {args.model}. It ships under examples/reference/model; to recreate it, run "
                 "the commands in examples/reference/README.md (`python -m training.base --out ...`).")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()  # fp16 on disk; CPUs want fp32
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if (Path(args.heads) / "config.json").is_file():
        return model, tokenizer, SelfSpecModel(model, heads=args.heads, tokenizer=tokenizer), "its Medusa heads"
    print(f"demo: no Medusa heads at {args.heads} (train them with `python -m training.heads --model {args.model} "
          f"--data stdlib --out {args.heads}`); drafting with n-gram lookup instead, which needs no parameters.\n")
    return model, tokenizer, SelfSpecModel(model, drafter="ngram", tokenizer=tokenizer), "n-gram lookup"


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    from training.corpus import heldout_prompts

    model, tokenizer, spec, drafts_with = load(args)
    k = args.num_draft_tokens if args.num_draft_tokens == "auto" else int(args.num_draft_tokens)
    prompt = heldout_prompts(1, prompt_chars=400, seed=args.prompt_seed)[0]
    prompt_ids = tokenizer(prompt, return_tensors="pt").input_ids  # [1, T]

    def plain():
        return model.generate(prompt_ids, attention_mask=torch.ones_like(prompt_ids), do_sample=False,
                              max_new_tokens=args.max_new_tokens, pad_token_id=tokenizer.eos_token_id)

    def speculative():
        return spec.generate(prompt_ids, max_new_tokens=args.max_new_tokens, num_draft_tokens=k)

    plain(), speculative()  # warm up (first-call allocations; with "auto", the device's verify cost curve)
    plain_seconds, spec_seconds = [], []
    for _ in range(args.runs):  # interleaved, so a burst of load elsewhere hits both alike
        started = time.perf_counter()
        plain_out = plain()
        plain_seconds.append(time.perf_counter() - started)
        started = time.perf_counter()
        out = speculative()
        spec_seconds.append(time.perf_counter() - started)
    plain_ids = plain_out[0, prompt_ids.shape[1]:].tolist()
    spec_ids = out.sequences[0, prompt_ids.shape[1]:].tolist()

    print("=" * 100)
    print("A held-out prompt (training.corpus.heldout_prompts; the model never trained on this file):\n")
    print(prompt, end="")
    print("-" * 40 + " greedy completion " + "-" * 41)
    print(out.text)
    print("=" * 100)
    if spec_ids != plain_ids:
        first = next((i for i, (a, b) in enumerate(zip(spec_ids, plain_ids)) if a != b), min(len(spec_ids), len(plain_ids)))
        sys.exit(f"demo: the outputs differ from token {first} on: selfspec {spec_ids[first:first + 5]} vs "
                 f"generate {plain_ids[first:first + 5]}. Greedy speculation must be exact: please report this.")
    print(f"Same {len(spec_ids)} tokens from plain model.generate and from selfspec: identical (checked).\n")

    stats = out.stats
    plain_median, spec_median = statistics.median(plain_seconds), statistics.median(spec_seconds)
    ratios = [p / s for p, s in zip(plain_seconds, spec_seconds)]
    acceptance = " ".join(f"{a:.2f}" for a in stats.acceptance_by_position) or "-"
    print(f"plain model.generate : {len(plain_ids) / plain_median:6.1f} tokens/s  (median of {args.runs} runs)")
    print(f"selfspec             : {len(spec_ids) / spec_median:6.1f} tokens/s  drafting with {drafts_with}, "
          f"num_draft_tokens={k}")
    print(f"speedup              : {plain_median / spec_median:.2f}x  (per-run pairs {min(ratios):.2f}x-{max(ratios):.2f}x, "
          f"{torch.get_num_threads()} torch thread)")
    print(f"tokens per forward   : {stats.tokens_per_forward:.2f}  ({stats.new_tokens} tokens in {stats.target_forwards} "
          "passes of the model, prefill included; plain decoding needs one per token)")
    print(f"acceptance           : {stats.acceptance_rate:.2f} of drafts; by draft position: {acceptance}")


if __name__ == "__main__":
    main()
