"""Early exit with shared work (verification resumes at the exit layer) vs recomputing every layer.

    OMP_NUM_THREADS=1 python examples/early_exit_shared_work.py                  # random Llama of the reference shape
    OMP_NUM_THREADS=1 python examples/early_exit_shared_work.py --model /work/runs/reference-model --exit-layer 2

Both variants propose the same drafts and produce the same tokens (greedy); only the work differs. Counts the
tokens each decoder layer processes (forward hooks) and times decoding in CPU time of this process (on a machine
shared with other jobs wall time mostly measures them): the time of a full generation minus that of a prefill +
one token. Rounds alternate between the variants. Prints one line per variant and the shared/recompute ratios.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import transformers

from selfspec import SelfSpecModel

PYTHON_PROMPT = '''import os


def walk(root):
    """Yield every file below root."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            yield os.path.join(dirpath, name)


def main():
'''


def load(args):
    if args.model:
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
        prompt = tokenizer(PYTHON_PROMPT * args.prompt_repeats, return_tensors="pt").input_ids
        return model.eval(), prompt
    config = transformers.LlamaConfig(  # default: the reference model's shape (FACTS.md), 6.8M parameters
        vocab_size=args.vocab_size, hidden_size=args.hidden_size, intermediate_size=3 * args.hidden_size,
        num_hidden_layers=args.num_layers, num_attention_heads=args.hidden_size // 64,
        num_key_value_heads=max(1, args.hidden_size // 128), max_position_embeddings=1024, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    return model, torch.randint(3, args.vocab_size, (1, 128), generator=torch.Generator().manual_seed(0))


def count_layer_tokens(spec, run) -> list[int]:
    layers = spec.target.parts.layers
    seen = [0] * len(layers)
    hooks = [
        layer.register_forward_hook(lambda m, args, out, i=i: seen.__setitem__(i, seen[i] + args[0].shape[1]))
        for i, layer in enumerate(layers)
    ]
    try:
        run()
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a saved causal LM directory (default: random Llama of the reference shape)")
    parser.add_argument("--exit-layer", type=int, default=2)
    parser.add_argument("--num-draft-tokens", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--prompt-repeats", type=int, default=2, help="copies of the built-in Python prompt (--model)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hidden-size", type=int, default=256, help="random model only")
    parser.add_argument("--num-layers", type=int, default=6, help="random model only")
    parser.add_argument("--vocab-size", type=int, default=8192, help="random model only")
    args = parser.parse_args()
    torch.set_num_threads(1)

    model, prompt = load(args)
    variants = {
        "shared": SelfSpecModel(model, drafter="early_exit", exit_layer=args.exit_layer),
        "recompute": SelfSpecModel(model, drafter="early_exit", exit_layer=args.exit_layer, share_work=False),
        "plain": SelfSpecModel(model, drafter="none"),
    }
    kwargs = dict(max_new_tokens=args.max_new_tokens, num_draft_tokens=args.num_draft_tokens, eos_token_id=[])
    outputs, seconds = {}, {name: [] for name in variants}
    for spec in variants.values():
        spec.generate(prompt, **kwargs)  # warm up
    for _ in range(args.rounds):
        for name, spec in variants.items():
            started = time.process_time()
            spec.generate(prompt, **{**kwargs, "max_new_tokens": 1})
            prefill = time.process_time() - started
            started = time.process_time()
            outputs[name] = spec.generate(prompt, **kwargs)
            seconds[name].append(time.process_time() - started - prefill)
    assert torch.equal(outputs["shared"].sequences, outputs["recompute"].sequences)
    assert torch.equal(outputs["shared"].sequences, outputs["plain"].sequences)

    num_layers = variants["shared"].target.num_layers
    print(
        f"{type(model).__name__} {num_layers} layers, exit_layer={args.exit_layer}, num_draft_tokens="
        f"{args.num_draft_tokens}, prompt {prompt.shape[1]} tokens, {args.max_new_tokens} new, "
        f"{torch.get_num_threads()} thread(s), CPU time, median of {args.rounds} rounds"
    )
    rows = {}
    for name, spec in variants.items():
        stats = outputs[name].stats
        steps = stats.target_forwards - 1
        layer_tokens = count_layer_tokens(spec, lambda: spec.generate(prompt, **kwargs))
        decode_tokens = sum(layer_tokens) - num_layers * prompt.shape[1]  # layer-token forwards after the prefill
        median = statistics.median(seconds[name])
        rows[name] = (decode_tokens, median, steps)
        print(
            f"{name:>9}: {stats.tokens_per_forward:.2f} tokens/step, acceptance {stats.acceptance_rate:.2f}, "
            f"{decode_tokens / num_layers / stats.new_tokens:.2f} full-model token-forwards per new token "
            f"(per layer: {[t - prompt.shape[1] for t in layer_tokens]}), "
            f"{1000 * median / max(steps, 1):.2f} ms/step, {1000 * median / stats.new_tokens:.2f} ms/token"
        )
    (work_s, time_s, _), (work_r, time_r, _) = rows["shared"], rows["recompute"]
    ratios = sorted(s / r for s, r in zip(seconds["shared"], seconds["recompute"]))  # within each round
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    print(
        f"shared/recompute: layer work {work_s / work_r:.3f}, decode time {time_s / time_r:.3f} (per-round ratios: "
        f"median {quartiles[1]:.3f}, quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}); "
        f"shared vs plain decoding: time {time_s / rows['plain'][1]:.3f}"
    )


if __name__ == "__main__":
    main()
