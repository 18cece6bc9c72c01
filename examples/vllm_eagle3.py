"""Serve SmolLM2 with an EAGLE-3 head in vLLM and compare with selfspec on the same prompts and the same CPU.

    python examples/vllm_eagle3.py --head examples/smollm2/eagle3      # in the .ci/interop environment

The head (a selfspec "eagle3" head or a speculators draft) is exported with `format="speculators"` beside a float32
copy of SmolLM2, which vLLM serves with `speculative_config={"method": "eagle3", ...}`. Reported, greedy, one prompt
at a time: whether vLLM's output with the head equals vLLM's without it and selfspec's; vLLM's mean acceptance length
(tokens per verify step) against selfspec's tokens per forward with the same head and chain length; tokens/s of both.
vLLM runs last (its engine process keeps cores busy), selfspec first with the same number of threads.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch


def selfspec_runs(model, head, prompts, args) -> tuple[list[list[int]], list[list[int]], float, float]:
    """(generate's tokens, selfspec's tokens, selfspec's tokens per forward, median tokens/s) per prompt."""
    from selfspec import SelfSpecModel

    spec = SelfSpecModel(model, heads=head, tree_size=0)  # chains, as vLLM drafts; the kernel keeps rows independent
    reference, ours, per_forward, speeds = [], [], [], []
    for ids in prompts:
        with torch.no_grad():
            # (an explicit mask: without one, generate masks every pad id, and SmolLM2's pad id is its <|im_end|>)
            plain = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                                   do_sample=False, eos_token_id=[])
        reference.append(plain[0, ids.shape[1]:].tolist())
        start = time.perf_counter()
        out = spec.generate(ids, max_new_tokens=args.max_new_tokens, num_draft_tokens=args.num_draft_tokens,
                            eos_token_id=[])
        speeds.append(args.max_new_tokens / (time.perf_counter() - start))
        ours.append(out.sequences[0, ids.shape[1]:].tolist())
        per_forward.append(out.stats.tokens_per_forward)
    return reference, ours, statistics.mean(per_forward), statistics.median(speeds)


def vllm_runs(base_dir: str, draft_dir: str | None, prompts, args) -> tuple[list[list[int]], float | None, float]:
    """(vLLM's tokens per prompt, its mean acceptance length or None without a draft, median tokens/s)."""
    from vllm import LLM, SamplingParams

    speculative = ({"method": "eagle3", "model": draft_dir, "num_speculative_tokens": args.num_draft_tokens}
                   if draft_dir else None)
    llm = LLM(model=base_dir, dtype="float32", enforce_eager=True, max_model_len=1024, seed=0,
              speculative_config=speculative, disable_log_stats=False)  # (stats on: the acceptance counters)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens, ignore_eos=True)
    outputs, speeds = [], []
    for ids in prompts:
        start = time.perf_counter()
        result = llm.generate([{"prompt_token_ids": ids[0].tolist()}], params, use_tqdm=False)[0]
        speeds.append(args.max_new_tokens / (time.perf_counter() - start))
        outputs.append(list(result.outputs[0].token_ids))
    counters = {metric.name: getattr(metric, "value", None) for metric in llm.get_metrics()}
    drafts, accepted = counters.get("vllm:spec_decode_num_drafts"), counters.get("vllm:spec_decode_num_accepted_tokens")
    if draft_dir and not drafts:
        raise SystemExit(f"vLLM reported no speculative drafts (its counters: {sorted(counters)})")
    acceptance = 1 + accepted / drafts if draft_dir else None
    del llm  # (its engine process ends with it)
    return outputs, acceptance, statistics.median(speeds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head", required=True, help="an 'eagle3' EAGLE head directory (selfspec or speculators format) "
                        "for SmolLM2, or 'fresh': an untrained one (drafts little; checks the plumbing)")
    parser.add_argument("--num-prompts", type=int, default=4, help="held-out chat questions (selfspec.bench's)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--num-draft-tokens", type=int, default=3, help="chain length, both engines")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for selfspec (two OpenMP threads beside a busy process spin-wait: 1 unless the machine is idle)")
    parser.add_argument("--work-dir", default=None, help="where the float32 base and the export go (default: temp)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from heads import EagleHead
    from selfspec.bench.prompts import CHAT_PROMPTS, prompt_ids
    from selfspec.loading import SMOLLM2_HUB_ID, load_model, load_tokenizer, plain_copy

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="selfspec-vllm-"))
    model = load_model("smollm2", quantized="dequantize")
    tokenizer = load_tokenizer("smollm2")
    base_dir, draft_dir = str(work / "base"), str(work / "draft")
    plain_copy(model).save_pretrained(base_dir)
    tokenizer.save_pretrained(base_dir)
    if args.head == "fresh":
        head = EagleHead.for_model(model, layout="eagle3", feature_layers="auto")
    else:
        head = EagleHead.from_pretrained(args.head, model=model)
    head = head.float().eval()
    head.save_pretrained(draft_dir, format="speculators", model=model, verifier_name_or_path=base_dir)
    prompts = prompt_ids(tokenizer, list(CHAT_PROMPTS[: args.num_prompts]), "chat", None, args.max_new_tokens, "cpu")

    reference, ours, ours_per_forward, ours_speed = selfspec_runs(model, head, prompts, args)
    plain_vllm, _, plain_speed = vllm_runs(base_dir, None, prompts, args)
    spec_vllm, acceptance, spec_speed = vllm_runs(base_dir, draft_dir, prompts, args)

    n = len(prompts)
    same = lambda a, b: sum(x == y for x, y in zip(a, b))  # noqa: E731
    print(f"\nSmolLM2-135M-Instruct ({SMOLLM2_HUB_ID}) float32, head {args.head}, {n} held-out chat prompts, "
          f"{args.max_new_tokens} new tokens, greedy, chains of {args.num_draft_tokens}, {os.cpu_count()} CPUs\n")
    print("| engine | tokens/s (median) | tokens per verify step | greedy output |")
    print("|---|---|---|---|")
    print(f"| vLLM, no speculation | {plain_speed:.1f} | 1.00 | {same(plain_vllm, reference)}/{n} equal to "
          "transformers' generate |")
    print(f"| vLLM + EAGLE-3 head | {spec_speed:.1f} | {acceptance:.2f} (mean acceptance length) | "
          f"{same(spec_vllm, plain_vllm)}/{n} equal to vLLM without it |")
    print(f"| selfspec + the same head | {ours_speed:.1f} | {ours_per_forward:.2f} (tokens per forward) | "
          f"{same(ours, reference)}/{n} equal to generate |")
    print(f"\nacceptance: vLLM {acceptance:.3f}, selfspec {ours_per_forward:.3f} "
          f"({abs(acceptance - ours_per_forward) / ours_per_forward:.1%} apart)")


if __name__ == "__main__":  # (vLLM starts its engine in a process of its own)
    main()
