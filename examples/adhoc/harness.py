"""What the ad hoc A/B scripts share from round 18's last ones on (earlier ones repeat it, frozen as run): one timed
call of plain `generate` or of a SelfSpecModel, the interleaved rounds of an A/B, greedy SelfSpecModels against
`generate` with the summary round 20-21's tree A/Bs print, SmolLM2 with held-out chat prompts, and the reference
model's batch of code prompts."""
import random
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch

REFERENCE = "examples/reference/model"


class Timed(NamedTuple):
    seconds: float
    tokens_per_forward: float
    new_tokens: list[int]
    stats: Any  # the call's GenerationStats (None for plain generate)


def timed_call(model, tokenizer, spec, prompt: torch.Tensor, **kwargs) -> Timed:
    """(seconds, tokens per target forward, new token ids, stats) of `model.generate` (spec None) or `spec.generate`
    on the [1, T] prompt with the same keyword arguments."""
    started = time.perf_counter()
    if spec is None:
        out = model.generate(prompt, pad_token_id=tokenizer.eos_token_id, attention_mask=torch.ones_like(prompt),
                             **kwargs)
        return Timed(time.perf_counter() - started, 1.0, out[0, prompt.shape[1]:].tolist(), None)
    out = spec.generate(prompt[0], **kwargs)
    return Timed(time.perf_counter() - started, out.stats.tokens_per_forward,
                 out.sequences[0, prompt.shape[1]:].tolist(), out.stats)


def interleaved(variants: list[str], prompts: list, rounds: int, run: Callable[[str, Any], Any],
                seed: int = 0) -> Iterator[dict[str, Any]]:
    """For each round and prompt, {variant: run(variant, prompt)} with the variants run in a random order (one
    generator, seeded, for the whole A/B)."""
    order = random.Random(seed)
    for _ in range(rounds):
        for prompt in prompts:
            yield {name: run(name, prompt) for name in order.sample(variants, len(variants))}


def greedy_against_generate(model, tokenizer, specs: dict, prompts: list, rounds: int, max_new_tokens: int) -> None:
    """Each SelfSpecModel in `specs` ({name: spec}) warmed up once, then plain `generate` and every spec run greedily
    on every prompt, `rounds` times, interleaved; prints each prompt's speedups and tokens per forward, then per
    variant the median speedup over `generate`, tokens per forward, tokens drafted per step (a tree's nodes) and how
    many runs gave `generate`'s tokens."""
    variants = ["generate", *specs]
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=[])

    def run(name, prompt):
        return timed_call(model, tokenizer, specs.get(name), prompt, **kwargs)

    for name in specs:
        run(name, prompts[0][:, -32:])  # warm-up
    speedups, tpf, drafted, identical = ({v: [] for v in variants} for _ in range(4))
    for results in interleaved(variants, prompts, rounds, run):
        plain = results["generate"]
        for name in variants:
            timed, stats = results[name], results[name].stats
            speedups[name].append(plain.seconds / timed.seconds)
            tpf[name].append(timed.tokens_per_forward)
            drafted[name].append(stats.drafted / max(stats.target_forwards - 1, 1) if stats else 0.0)
            identical[name].append(timed.new_tokens == plain.new_tokens)
        print(" ".join(f"{name}: {speedups[name][-1]:.2f}x {tpf[name][-1]:.2f}" for name in specs), flush=True)
    print(f"{rounds} rounds x {len(prompts)} prompts, {max_new_tokens} new tokens; "
          "medians of per-run ratios to generate")
    width = max(map(len, variants)) + 1
    for name in variants:
        median, mean = statistics.median(speedups[name]), statistics.mean(speedups[name])
        same, runs = sum(identical[name]), len(identical[name])
        print(f"{name:{width}s} {median:.3f}x (mean {mean:.3f}x)  tokens/forward {statistics.mean(tpf[name]):.2f}  "
              f"drafted per step {statistics.mean(drafted[name]):.2f}  identical {same}/{runs}")


def smollm2_chat(num_prompts: int, max_new_tokens: int):
    """(SmolLM2, its tokenizer, `num_prompts` held-out chat prompts [1, T] with room for max_new_tokens)."""
    from selfspec.bench.models import load
    from selfspec.bench.prompts import prompt_ids, prompt_texts
    from selfspec.bench.settings import parse_args

    loaded = load(parse_args(["--model", "smollm2", "--heads", "none", "--eagle", "examples/smollm2/eagle"]), [])
    kind, texts = prompt_texts(loaded.tokenizer, num_prompts)
    return loaded.model, loaded.tokenizer, prompt_ids(loaded.tokenizer, texts, kind, 2048, max_new_tokens, "cpu")


def reference_batch(batch_size: int, max_new_tokens: int = 96):
    """(a SelfSpecModel of the reference model with its Medusa heads, `batch_size` [T] held-out code prompts cut to
    leave room for max_new_tokens, cycling through 16 when more are asked)."""
    from selfspec.bench.prompts import prompt_ids, prompt_texts
    from selfspec.engine import SelfSpecModel
    from selfspec.loading import load_model, load_tokenizer

    model, tokenizer = load_model(REFERENCE), load_tokenizer(REFERENCE)
    kind, texts = prompt_texts(tokenizer, 16)
    pool = prompt_ids(tokenizer, texts, kind, 8192, max_new_tokens, "cpu")
    spec = SelfSpecModel(model, heads="examples/reference/heads", tokenizer=tokenizer)
    return spec, [pool[i % len(pool)][0] for i in range(batch_size)]
