"""What verifying k tokens costs against decoding one, k = 1..64, on a randomly initialised Llama (weights do not
change the cost). This is the curve that decides how many draft tokens pay: verifying k drafts is one forward over
k + 1 tokens, so wall-clock speedup is about tokens per forward / cost(k + 1).

    python examples/verify_cost.py --device cuda --dtype bfloat16 --json verify_cost.json   # 1B-class (Llama 3.2 1B shape)
    python examples/verify_cost.py --device cpu --small                                     # the logic, in seconds

Each forward runs after a `--context`-token KV cache, returns logits for all k positions (as verification needs),
and the cache is cut back after it. Sizes are interleaved within each round (so a burst of load hits all alike),
the first round warms up, and medians over rounds are reported. Eager PyTorch: on a GPU the small-k figures include
kernel-launch overhead, which flattens the curve; the ratio is what a plain `transformers` model pays.
"""
from __future__ import annotations

import argparse
import inspect
import json
import platform
import statistics
import time

import torch

# Llama 3.2 1B's shape (tied embeddings): 1.24B parameters. --small: the reference model's shape, for a CPU check.
LARGE = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
             num_key_value_heads=8, vocab_size=128256, max_position_embeddings=4096, tie_word_embeddings=True)
SMALL = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=6, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=8192, max_position_embeddings=1024, tie_word_embeddings=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda or cpu")
    parser.add_argument("--dtype", default="bfloat16", help="bfloat16, float16 or float32")
    parser.add_argument("--small", action="store_true", help="the 6.8M-parameter reference shape instead of 1B, k <= 16")
    parser.add_argument("--max-k", type=int, default=None, help="largest number of tokens verified (default 64; 16 --small)")
    parser.add_argument("--context", type=int, default=512, help="tokens already in the KV cache (default 512)")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 20 on cuda, 5 on cpu)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--json", default=None, help="write the figures here")
    return parser.parse_args(argv)


def random_model(config_kwargs: dict, device: str, dtype: torch.dtype):
    """A Llama with random weights, built directly on the device in the dtype (no float32 copy on the host)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(LlamaConfig(**config_kwargs))
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@torch.inference_mode()
def measure(model, device: str, max_k: int, context: int, repeats: int) -> list[float]:
    """[k - 1] median seconds of one forward over k new tokens (k = 1..max_k) after `context` cached tokens."""
    from transformers import DynamicCache

    # transformers 5.24 names the cache argument `cache`; earlier 5.x releases `past_key_values`.
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache = DynamicCache(config=model.config)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, context + max_k), generator=g).to(device)
    model(input_ids=ids[:, :context], use_cache=True, logits_to_keep=1, **{cache_arg: cache})
    seconds = [[] for _ in range(max_k)]
    for round_ in range(repeats + 1):  # round 0 warms up every size
        for k in range(1, max_k + 1):
            _sync(device)
            started = time.perf_counter()
            model(input_ids=ids[:, context:context + k], use_cache=True, **{cache_arg: cache}).logits.float()
            _sync(device)
            if round_:
                seconds[k - 1].append(time.perf_counter() - started)
            cache.crop(-k)  # negative: remove k tokens (5.x); back to `context`
            assert cache.get_seq_length() == context
    return [statistics.median(s) for s in seconds]


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    max_k = args.max_k or (16 if args.small else 64)
    repeats = args.repeats or (20 if args.device.startswith("cuda") else 5)
    context = min(args.context, 128) if args.small else args.context
    config = SMALL if args.small else LARGE
    model = random_model(config, args.device, dtype)
    parameters = sum(p.numel() for p in model.parameters())
    medians = measure(model, args.device, max_k, context, repeats)
    import transformers

    result = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu",
        "dtype": args.dtype,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "model": {**config, "parameters": parameters},
        "context": context,
        "repeats": repeats,
        "tokens": list(range(1, max_k + 1)),
        "seconds": medians,
        "relative": [m / medians[0] for m in medians],  # cost of verifying k tokens / decoding one
    }
    print(f"{parameters / 1e6:.0f}M-parameter random Llama, {args.dtype} on {result['device']}, "
          f"{context}-token cache, median of {repeats} rounds")
    print("| tokens in the forward | ms | x one-token decode | tokens per ms |")
    print("|---|---|---|---|")
    for k in range(1, max_k + 1):
        if k <= 8 or k & (k - 1) == 0 or k == max_k:
            m = medians[k - 1]
            print(f"| {k} | {m * 1e3:.2f} | {m / medians[0]:.2f} | {k / (m * 1e3):.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
