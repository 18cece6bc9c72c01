"""Where a plain decode step's time goes: the target's one-token forward, the products inside it, the LM head, and
(from the table's speculation-off row) the engine's own bookkeeping around them. Medians of repeated one-token
decodes at a realistic cache length, under the attention the engine takes; knows nothing about drafters."""
from __future__ import annotations

import statistics
import time

import torch

from selfspec.attention_backends import engine_attention_context
from selfspec.kernel.quantized import QuantizedLinear
from selfspec.target import TargetModel

CACHE_TOKENS = 96  # entries in the cache while timing (about a held-out prompt plus half a reply)
REPEATS = 30


def _median_ms(run, repeats: int = REPEATS) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


@torch.no_grad()
def step_breakdown(model) -> dict:
    """{"forward_ms", "products_ms", "lm_head_ms", "plain_forward"}: a one-token forward of the target after
    CACHE_TOKENS entries, the kernel's products of its decoder alone (each layer's one-row product, as many as a
    forward makes), and the LM head over one row; "plain_forward": whether the forward ran `llama_forward.py`."""
    target = TargetModel(model)
    device = target.device
    cache = target.new_cache()
    token = torch.tensor([3], device=device)
    with engine_attention_context(model):
        target.forward(torch.arange(CACHE_TOKENS, device=device) % target.vocab_size, cache)
        hidden = target.forward(token, cache)

        def decode():
            target.forward(token, cache)
            cache.rollback(CACHE_TOKENS)

        forward_ms = _median_ms(decode)
        lm_head_ms = _median_ms(lambda: target.logits(hidden))
    layers = [m for m in target.decoder.modules() if isinstance(m, QuantizedLinear)]
    inputs = [torch.randn(1, 1, layer.in_features) for layer in layers]

    def products():
        for layer, x in zip(layers, inputs):
            QuantizedLinear.eager_product(x, layer.weight, layer.backend)

    return {"forward_ms": round(forward_ms, 2), "products_ms": round(_median_ms(products, 10), 2) if layers else 0.0,
            "lm_head_ms": round(lm_head_ms, 2), "plain_forward": target.plain_forward is not None,
            "cache_tokens": CACHE_TOKENS}


def describe_breakdown(breakdown: dict, plain_tokens_per_s: float | None) -> str:
    """One line for the report: the forward split into products and the rest, the LM head, and what is left of a
    speculation-off token (its 1000 / tokens-per-second, prefill included) for the engine."""
    forward, products, head = breakdown["forward_ms"], breakdown["products_ms"], breakdown["lm_head_ms"]
    line = (f"decode step (one token after {breakdown['cache_tokens']} cached): forward {forward:.1f} ms "
            f"({'plain Llama forward' if breakdown['plain_forward'] else 'the decoder module'}; of it the decoder's "
            f"kernel products {products:.1f} ms when run alone, the rest {max(forward - products, 0.0):.1f} ms), "
            f"LM head {head:.1f} ms")
    if plain_tokens_per_s:
        token_ms = 1000.0 / plain_tokens_per_s
        engine = token_ms - forward - head
        line += f"; speculation off spent {token_ms:.1f} ms a token"
        if engine >= 0:
            line += f", {engine:.1f} ms of it elsewhere (the engine's bookkeeping, sampling, the prefill's share)"
        else:  # (the two were timed apart, and this machine's speed drifts)
            line += ", less than the forward and LM head timed here: the machine's speed moved between the two"
    return line
